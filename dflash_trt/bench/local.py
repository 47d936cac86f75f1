"""Local benchmark (batch 1): DFlash vs autoregressive decoding through the engine, side by side.

For every prompt and block size the same request is decoded both ways in one run, alternating, by two
engines over the same loaded pair (runtime/generate.py: the scheduler and runners a server runs, one
with the drafter and one without); the report gives mean acceptance length τ, per-position acceptance,
tokens/s of each, their ratio with a 95% interval, and whether the tokens are identical.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from dflash_trt.checkpoint.json_fields import jsonl_records
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.runtime.local import local_engine


@dataclass
class BlockResult:
    block_size: int
    prompts: int
    generated_tokens: int
    spec_seconds: float
    ar_seconds: float
    mean_acceptance_length: float
    per_position_acceptance: list[float]
    acceptance_histogram: dict[int, int]
    identical: bool
    acceptance_lengths: list[int] = field(default_factory=list, repr=False)
    temperature: float = 0.0
    prompt_seconds: list[tuple[float, float]] = field(default_factory=list, repr=False)  # (DFlash, AR) per prompt
    context_length: int | None = None  # every prompt's length (bench --context-lengths), None: as given
    spec_prefill_seconds: float = 0.0  # of spec_seconds / ar_seconds: admitting the prompts (the rest decodes)
    ar_prefill_seconds: float = 0.0

    @property
    def spec_tokens_per_s(self) -> float:
        return self.generated_tokens / self.spec_seconds

    @property
    def ar_tokens_per_s(self) -> float:
        return self.generated_tokens / self.ar_seconds

    @property
    def speedup(self) -> float:
        return self.ar_seconds / self.spec_seconds

    @property
    def decode_speedup(self) -> float:
        """The speed-up after the prompt is in: what DFlash changes; a long prompt's prefill (the target's on
        both sides, plus the drafter's context on DFlash's) pulls the end-to-end ratio towards 1."""
        return (self.ar_seconds - self.ar_prefill_seconds) / (self.spec_seconds - self.spec_prefill_seconds)

    @property
    def speedup_interval(self) -> tuple[float, float]:
        """A 95% interval of the speed-up: prompts resampled with replacement (each keeps its DFlash and AR
        seconds together), the ratio of sums of each resample, its 2.5th and 97.5th percentiles. It spans what
        the prompts' mix and a shared machine's drift make of one run; a ratio whose interval holds 1.0 has
        not been told apart from AR by this run."""
        return speedup_interval(self.prompt_seconds) if self.prompt_seconds else (self.speedup, self.speedup)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("acceptance_lengths")
        d.pop("prompt_seconds")
        return d | {"spec_tokens_per_s": self.spec_tokens_per_s, "ar_tokens_per_s": self.ar_tokens_per_s,
                    "speedup": self.speedup, "speedup_ci95": list(self.speedup_interval),
                    "decode_speedup": self.decode_speedup}


def speedup_interval(pairs: list[tuple[float, float]], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of sum(AR) / sum(DFlash) over (DFlash s, AR s) pairs (fixed seed: the
    same run reports the same interval)."""
    import random

    rng, n = random.Random(seed), len(pairs)
    ratios = []
    for _ in range(resamples):
        picked = [pairs[rng.randrange(n)] for _ in range(n)]
        ratios.append(sum(ar for _, ar in picked) / sum(spec for spec, _ in picked))
    ratios.sort()
    return ratios[int(0.025 * (resamples - 1))], ratios[int(0.975 * (resamples - 1))]


def load_prompts(path: str | Path | None, tokenizer, limit: int | None, served: bool = False) -> list:
    """Prompts from a JSONL file (`token_ids` or `text` per line), default: the shipped held-out set. Text is
    tokenized with `tokenizer`, or kept as text when `served` (the server tokenizes it)."""
    from dflash_trt.engine.golden import HELDOUT
    from dflash_trt.errors import ConfigError

    path = Path(path) if path else HELDOUT
    prompts = []
    for n, record in jsonl_records(path):
        if isinstance(record, dict) and isinstance(record.get("token_ids"), list):
            prompts.append([int(t) for t in record["token_ids"]])
        elif isinstance(record, dict) and isinstance(record.get("text"), str):
            if served:
                prompts.append(record["text"])
            elif tokenizer is None:
                raise ConfigError(f"{path}:{n}: a text prompt, but the target has no tokenizer; give token_ids")
            else:
                prompts.append(tokenizer.encode(record["text"], add_special_tokens=False))
        else:
            raise ConfigError(f"{path}:{n}: expected an object with 'token_ids' (a list) or 'text' (a string)")
    return prompts[:limit] if limit else prompts


def context_prompts(prompts: list, length: int, count: int, where: str = "the prompts") -> list[list[int]]:
    """`count` prompts of exactly `length` tokens: each ends where one of `prompts` ends (its natural
    continuation follows) and reaches back over the prompts before it, read as one text in file order.
    The ends are spread evenly over the prompts long enough to have `length` tokens before them; nothing
    is repeated to make up a length (a copied span would be drafted too easily)."""
    from dflash_trt.errors import ConfigError

    if any(not isinstance(p, list) for p in prompts):
        raise ConfigError(f"{where}: --context-lengths cuts token ids; give 'token_ids' on every line (the "
                          "server tokenizes text, so its lengths are not known here)")
    stream, ends = [], []
    for prompt in prompts:
        stream += prompt
        ends.append(len(stream))
    ends = [e for e in ends if e >= length]
    if not ends:
        raise ConfigError(f"{where}: {len(stream)} tokens in all, fewer than --context-lengths {length}; give "
                          "--prompts with more text")
    n = min(count, len(ends))
    picked = sorted({ends[round(i * (len(ends) - 1) / max(n - 1, 1))] for i in range(n)})
    return [stream[e - length: e] for e in picked]


def _timed(engine, request):
    """(result, wall seconds, prefill seconds) of one request."""
    (result,), stats = engine.generate_with_stats([request])
    return result, stats.prefill_s + stats.decode_s, stats.prefill_s


def prompt_requests(prompts: list[list[int]], params: SamplingParams, max_new_tokens: int,
                    stop_ids: frozenset[int] = frozenset()) -> list[Request]:
    """One request per prompt; prompt i samples with seed + i, as served mode's requests do (one seed for
    every prompt would draw the same noise at the same positions in each)."""
    return [Request(tuple(prompt), replace(params, seed=params.seed + i), StopCriteria(max_new_tokens, stop_ids))
            for i, prompt in enumerate(prompts)]


@torch.inference_mode()
def bench_block_size(pair, prompts: list[list[int]], block_size: int, max_new_tokens: int,
                     params: SamplingParams, stop_ids: frozenset[int], progress=None, min_confidence: float = 0.0,
                     width_policy: str = "auto") -> BlockResult:
    """Decode every prompt both ways; DFlash with the width policy `width_policy` (runtime/width.py) and
    the confidence cut `min_confidence` (decoding/drafts.py)."""
    # steady state, as a server runs: one untimed prompt first at this temperature (a seed no timed prompt
    # has) warms both engines and gives the width policy its first measurements
    *requests, warm = prompt_requests(prompts + prompts[:1], params, max_new_tokens, stop_ids)
    longest = max(len(r.prompt) + r.stop.max_new_tokens for r in requests + [warm])
    dflash = local_engine(pair, longest, block_size, min_confidence=min_confidence, width_policy=width_policy,
                          max_batch_size=1)
    ar = local_engine(pair, longest, autoregressive=True, max_batch_size=1)
    dflash.generate([warm])
    ar.generate([warm])
    spec_s = ar_s = spec_prefill = ar_prefill = 0.0
    tokens, identical, lengths, accepted, pairs = 0, True, [], [], []
    for i, request in enumerate(requests):
        if i % 2:  # every other prompt AR first: a machine's drift within a prompt's pair favours neither
            ar_result, t_ar, p_ar = _timed(ar, request)
            spec, t_spec, p_spec = _timed(dflash, request)
        else:
            spec, t_spec, p_spec = _timed(dflash, request)
            ar_result, t_ar, p_ar = _timed(ar, request)
        spec_s, ar_s, spec_prefill, ar_prefill = spec_s + t_spec, ar_s + t_ar, spec_prefill + p_spec, ar_prefill + p_ar
        pairs.append((t_spec, t_ar))
        identical &= spec.tokens == ar_result.tokens
        tokens += len(spec.tokens)
        lengths += spec.acceptance_lengths
        accepted += spec.accepted_drafts
        if progress is not None:
            progress()
    k = block_size - 1
    accepted = accepted or [0]
    return BlockResult(
        block_size=block_size, prompts=len(prompts), generated_tokens=tokens, spec_seconds=spec_s, ar_seconds=ar_s,
        mean_acceptance_length=sum(lengths) / len(lengths),
        per_position_acceptance=[sum(a >= i for a in accepted) / len(accepted) for i in range(1, k + 1)],
        acceptance_histogram={n: lengths.count(n) for n in range(1, block_size + 1)},
        identical=identical, acceptance_lengths=lengths, temperature=params.temperature, prompt_seconds=pairs,
        spec_prefill_seconds=spec_prefill, ar_prefill_seconds=ar_prefill,
    )
