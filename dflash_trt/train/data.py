"""Training data for drafters: read samples, optionally regenerate them with the target, pack.

Accepted inputs (`--data`, repeatable):
- `.jsonl`: one object per line, `{"token_ids": [...]}`, `{"text": "..."}` or
  `{"prompt": "...", "completion": "..."}` (loss only on the completion); a `token_ids` record may carry
  `trained_from` (loss from that position on) and `drafter_from` (the target reads the tokens before it as
  context, the drafter's training row starts there: samples after long prefixes for a windowed drafter);
- any other file: read as UTF-8 text and cut into windows.
With regeneration, each sample's prompt (its `prompt`, or its first `prompt_tokens` tokens) is
continued by the target itself, so the drafter learns the exact distribution it will verify
against (DFlash drafters are trained on target-regenerated data, reference §5).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash_trt.checkpoint.json_fields import jsonl_records
from dflash_trt.errors import ConfigError


@dataclass
class Sample:
    tokens: list[int]
    trained_from: int = 0  # loss applies to positions >= trained_from
    drafter_from: int = 0  # tokens before it are the target's context only (not in the drafter's row)


def read_samples(paths: list[Path], tokenizer, window: int) -> list[Sample]:
    """Samples from JSONL records or raw text files (tokenized with the target's tokenizer)."""
    samples: list[Sample] = []
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"{path}: data file not found")
        if path.suffix == ".jsonl":
            samples += _jsonl_samples(path, tokenizer)
        else:
            tokens = _encode(tokenizer, path.read_text(encoding="utf-8", errors="replace"), path)
            samples += [Sample(tokens[i : i + window]) for i in range(0, max(1, len(tokens) - 1), window)]
    samples = [s for s in samples if len(s.tokens) >= 2]
    if not samples:
        raise ConfigError(f"no usable training samples in {[str(p) for p in paths]}")
    return samples


def _encode(tokenizer, text: str, where: Path) -> list[int]:
    if tokenizer is None:
        raise ConfigError(f"{where}: text data needs a tokenizer; the target folder has no tokenizer.json")
    return tokenizer.encode(text, add_special_tokens=False)


def _jsonl_samples(path: Path, tokenizer) -> list[Sample]:
    out = []
    for n, record in jsonl_records(path):
        if not isinstance(record, dict):
            raise ConfigError(f"{path}:{n}: expected a JSON object with a 'token_ids', 'text' or 'prompt' field")
        if "token_ids" in record:
            tokens = [int(t) for t in record["token_ids"]]
            trained_from, drafter_from = int(record.get("trained_from", 0)), int(record.get("drafter_from", 0))
            if not 0 <= drafter_from <= trained_from <= len(tokens):
                raise ConfigError(f"{path}:{n}: expected 0 <= drafter_from ({drafter_from}) <= trained_from "
                                  f"({trained_from}) <= the {len(tokens)} tokens")
            out.append(Sample(tokens, trained_from, drafter_from))
        elif "prompt" in record:
            prompt = _encode(tokenizer, record["prompt"], path)
            completion = _encode(tokenizer, record.get("completion", ""), path)
            out.append(Sample(prompt + completion, len(prompt)))
        elif "text" in record:
            out.append(Sample(_encode(tokenizer, record["text"], path)))
        else:
            raise ConfigError(f"{path}:{n}: expected a 'token_ids', 'text' or 'prompt' field")
    return out


def regenerate(target, samples: list[Sample], prompt_tokens: int, new_tokens: int, temperature: float | list[float],
               seed: int, batch_size: int = 32, stop_ids=frozenset(), progress=None) -> list[Sample]:
    """Replace each sample's continuation by the target's own decoding of its prompt, sampled at `temperature`
    (0: greedy); a list of temperatures mixes them, sample i taking temperatures[i % n] (e.g. greedy and
    sampled continuations for a drafter that serves both)."""
    temperatures = list(temperature) if isinstance(temperature, (list, tuple)) else [temperature]
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.model.loader import LoadedPair
    from dflash_trt.runtime.local import local_engine

    prompts = [tuple(s.tokens[: s.trained_from or prompt_tokens]) for s in samples]
    longest = max((len(p) for p in prompts), default=0) + new_tokens
    engine = local_engine(LoadedPair(target, None, None, Path(), None), longest, autoregressive=True,
                          max_batch_size=batch_size)
    out = []
    for start in range(0, len(samples), batch_size):
        chunk = prompts[start : start + batch_size]
        requests = [Request(p, SamplingParams(temperatures[(start + i) % len(temperatures)], seed=seed + start + i),
                            StopCriteria(new_tokens, stop_ids)) for i, p in enumerate(chunk)]
        for prompt, result in zip(chunk, engine.generate(requests)):
            out.append(Sample(list(prompt) + result.tokens, len(prompt)))
        if progress is not None:
            progress(len(chunk))
    return out


def pack(samples: list[Sample], seq_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> tokens [N, seq_len] (right-padded / truncated), loss_mask [N, seq_len] bool: each sample's row from its
    `drafter_from` (`contexts` gives the tokens before it, which only the target reads)."""
    tokens = torch.full((len(samples), seq_len), pad_id, dtype=torch.int64)
    mask = torch.zeros(len(samples), seq_len, dtype=torch.bool)
    for i, s in enumerate(samples):
        seq = s.tokens[s.drafter_from : s.drafter_from + seq_len]
        tokens[i, : len(seq)] = torch.tensor(seq, dtype=torch.int64)
        mask[i, s.trained_from - s.drafter_from : len(seq)] = True
    return tokens, mask


def contexts(samples: list[Sample]) -> list[list[int]] | None:
    """The tokens before each sample's drafter row (the target's context only), or None when no sample has any."""
    if not any(s.drafter_from for s in samples):
        return None
    return [s.tokens[: s.drafter_from] for s in samples]


def save_samples(path: Path, samples: list[Sample]) -> None:
    lines = (json.dumps({"token_ids": s.tokens, "trained_from": s.trained_from}
                        | ({"drafter_from": s.drafter_from} if s.drafter_from else {})) for s in samples)
    path.write_text("\n".join(lines) + "\n")


def load_samples(path: Path) -> list[Sample]:
    return _jsonl_samples(path, None)


def vocab_from_data(pair, paths: list[str], regen: tuple[int, int] | None, max_samples: int | None,
                    coverage: float) -> dict:
    """A draft vocabulary record (model/draft_vocab.py) from the trained positions of data files; with
    `regen` = (prompt tokens, new tokens), from the target's own greedy continuations instead."""
    from dflash_trt.model import draft_vocab

    samples = read_samples([Path(p) for p in paths], pair.tokenizer, sum(regen) if regen else 256)
    samples = samples[:max_samples] if max_samples else samples
    if regen:
        samples = regenerate(pair.target, samples, *regen, 0.0, 0, stop_ids=frozenset(pair.target.config.eos_token_ids))
    counts = draft_vocab.count_tokens(s.tokens[s.trained_from:] for s in samples)
    source = f"{len(samples)} samples of {', '.join(paths)}" + (" regenerated by the target" if regen else "")
    return draft_vocab.vocab_record(counts, pair.target.config.vocab_size, source, coverage)
