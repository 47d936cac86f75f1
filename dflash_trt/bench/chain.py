"""`dflash-trt bench --url URL --chain N`: agent chains, where each call waits on the one before.

A chain is N sequential calls through the server; call i's prompt is the i-th prompt of the chain
followed by call i-1's answer (an agent handing its output to the next), so every millisecond a call
saves is saved again by each call after it. At each level K of `--concurrency`, K chains run side by
side (K independent pipelines sharing the server), 2·K chains in all (at least 4), once on `dflash`
and once on `dflash_ar`: end-to-end chain latency, its spread, and DFlash's speed-up. Greedy chains
are also a lossless check: both models must hand the same answers down every chain.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from dflash_trt.triton.client import grpc_generate, request_inputs


@dataclass
class ChainPoint:
    model: str
    parallel: int  # chains running side by side
    calls: int  # calls per chain (N)
    latencies_s: list[float] = field(repr=False)  # end-to-end, one per chain
    call_s: list[float] = field(repr=False)  # every call's latency
    output_tokens: int = 0
    answers: list = field(default_factory=list, repr=False)  # each chain's last answer (token ids or text)
    temperature: float = 0.0

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.latencies_s)

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]

    @property
    def stdev_s(self) -> float:
        return statistics.stdev(self.latencies_s) if len(self.latencies_s) > 1 else 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("answers")
        return d | {"mean_s": self.mean_s, "p50_s": self.quantile(0.5), "p90_s": self.quantile(0.9),
                    "stdev_s": self.stdev_s, "call_mean_s": statistics.fmean(self.call_s)}


def _carry(base, answer):
    """Call i's prompt: its own prompt, then the previous answer (ids after ids, text after text)."""
    if answer is None:
        return base
    return base + answer


def run_chain(url: str, model: str, prompts: list, calls: int, max_new_tokens: int, temperature: float,
              seed: int) -> tuple[float, list[float], int, object]:
    """One chain: (end-to-end seconds, per-call seconds, output tokens, last answer)."""
    answer, per_call, tokens = None, [], 0
    t0 = time.perf_counter()
    for i in range(calls):
        prompt = _carry(prompts[i % len(prompts)], answer)
        ids, text = (prompt, None) if isinstance(prompt, list) else (None, prompt)
        inputs = request_inputs(text, ids, max_new_tokens, temperature=temperature, seed=seed + i, stream=True)
        start = time.perf_counter()
        result = grpc_generate(url, inputs, model=model)
        per_call.append(time.perf_counter() - start)
        tokens += len(result.token_ids)
        kept = result.token_ids[:-1] if result.finish_reason == "stop" else result.token_ids  # drop the end token
        answer = list(kept) if ids is not None else result.text
    return time.perf_counter() - t0, per_call, tokens, answer


def chain_point(url: str, model: str, prompts: list, calls: int, parallel: int, max_new_tokens: int,
                temperature: float = 0.0, seed: int = 0, progress=None) -> ChainPoint:
    """2·parallel chains (at least 4), `parallel` at a time; chain j starts at prompt j·calls."""
    n_chains = max(4, 2 * parallel)

    def one(j: int):
        window = [prompts[(j * calls + i) % len(prompts)] for i in range(calls)]
        out = run_chain(url, model, window, calls, max_new_tokens, temperature, seed + 1000 * j)
        if progress is not None:
            progress()
        return out

    with ThreadPoolExecutor(parallel) as pool:
        chains = list(pool.map(one, range(n_chains)))
    return ChainPoint(model, parallel, calls, [c[0] for c in chains], [s for c in chains for s in c[1]],
                      sum(c[2] for c in chains), [c[3] for c in chains], temperature)


def chain_sweep(url: str, prompts: list, calls: int, levels: list[int], max_new_tokens: int, sampling: dict,
                progress_factory=None, models: tuple[str, ...] = ("dflash", "dflash_ar")) -> list[ChainPoint]:
    points = []
    temperature = (sampling.get("temperatures") or [sampling.get("temperature", 0.0)])[0]
    for parallel in levels:
        for model in models:
            total = max(4, 2 * parallel)
            tick = progress_factory(f"{model} chains x{parallel}", total) if progress_factory else None
            points.append(chain_point(url, model, prompts, calls, parallel, max_new_tokens, temperature,
                                      sampling.get("seed", 0), tick))
    return points


def speedups(points: list[ChainPoint]) -> dict[int, float]:
    """AR mean chain latency / DFlash mean chain latency, per level of parallel chains."""
    by = {(p.model, p.parallel): p for p in points}
    return {k: by["dflash_ar", k].mean_s / by["dflash", k].mean_s
            for k in sorted({p.parallel for p in points}) if ("dflash", k) in by and ("dflash_ar", k) in by}


def identical_answers(points: list[ChainPoint]) -> dict[int, bool]:
    """Per level: whether both models handed down the same answers (greedy chains must)."""
    by = {(p.model, p.parallel): p for p in points}
    return {k: by["dflash", k].answers == by["dflash_ar", k].answers
            for k in sorted({p.parallel for p in points}) if ("dflash", k) in by and ("dflash_ar", k) in by}
