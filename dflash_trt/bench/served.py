"""Served benchmark: concurrency sweep over gRPC streaming against `dflash` and `dflash_ar`.

At each concurrency c, c client threads each send requests back to back (streaming) until the
prompt list is used up. Both models are the same bundle on the same server: `dflash` decodes
with DFlash, `dflash_ar` autoregressively, so the two curves are measured side by side.
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from dflash_trt.triton.client import ServedResult, grpc_generate, request_inputs


@dataclass
class ServedPoint:
    model: str
    concurrency: int
    requests: int
    wall_s: float
    output_tokens: int
    ttft_mean_s: float
    ttft_p90_s: float
    tpot_mean_s: float  # mean time per output token after the first
    per_user_tokens_per_s: float  # mean over requests of tokens / request time
    mean_acceptance_length: float
    acceptance_lengths: list[int] = field(default_factory=list, repr=False)
    temperature: float = 0.0
    context_length: int | None = None  # every prompt's length (bench --context-lengths), None: as given

    @property
    def output_tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def per_position_acceptance(self) -> list[float]:
        """[i-1]: share of verify steps that committed more than i tokens (draft i accepted)."""
        steps = self.acceptance_lengths
        return [sum(n > i for n in steps) / len(steps) for i in range(1, max(steps, default=1))]

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("acceptance_lengths")
        return d | {"output_tokens_per_s": self.output_tokens_per_s,
                    "per_position_acceptance": self.per_position_acceptance}


def _point(model: str, concurrency: int, results: list[ServedResult], wall: float,
           temperature: float = 0.0) -> ServedPoint:
    ttfts = sorted(r.ttft_s for r in results)
    tpots = [(r.total_s - r.ttft_s) / (len(r.token_ids) - 1) for r in results if len(r.token_ids) > 1]
    lengths = [n for r in results for n in r.acceptance_lengths]
    return ServedPoint(
        model=model, concurrency=concurrency, requests=len(results), wall_s=wall,
        output_tokens=sum(len(r.token_ids) for r in results),
        ttft_mean_s=statistics.fmean(ttfts), ttft_p90_s=ttfts[int(0.9 * (len(ttfts) - 1))],
        tpot_mean_s=statistics.fmean(tpots) if tpots else 0.0,
        per_user_tokens_per_s=statistics.fmean(len(r.token_ids) / r.total_s for r in results),
        mean_acceptance_length=sum(lengths) / len(lengths) if lengths else 0.0,
        acceptance_lengths=lengths, temperature=temperature,
    )


def _send(url: str, model: str, prompts: list, concurrency: int, max_new_tokens: int, sampling: dict,
          progress=None) -> tuple[list[ServedResult], float]:
    """Every prompt once with `concurrency` in flight: the results and the wall seconds."""
    def one(item):
        i, prompt = item
        ids = prompt if isinstance(prompt, list) else None
        text = prompt if isinstance(prompt, str) else None
        # no prefix cache: a sweep sends the same prompts to both models, round after round, which no workload
        # does; it measures decoding (bench --trace measures the cache)
        inputs = request_inputs(text, ids, max_new_tokens, seed=sampling.get("seed", 0) + i,
                                temperature=sampling.get("temperature", 0.0), stream=True, prefix_cache=False)
        result = grpc_generate(url, inputs, model=model)
        if progress is not None:
            progress()
        return result

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(one, enumerate(prompts)))
    return results, time.perf_counter() - t0


def round_orders(models: tuple[str, ...], rounds: int) -> list[tuple[str, ...]]:
    """The models' order in each round: forwards, then backwards, ... (A B, B A, A B, ...), so a machine
    whose speed drifts over a point's minutes favours neither model."""
    return [tuple(models) if r % 2 == 0 else tuple(reversed(models)) for r in range(rounds)]


def sweep(url: str, prompts: list, levels: list[int], max_new_tokens: int, sampling: dict,
          models: tuple[str, ...] = ("dflash", "dflash_ar"), progress_factory=None, rounds: int = 1) -> list[ServedPoint]:
    """Every (temperature, concurrency, model) point; `sampling["temperatures"]` (or one "temperature").
    `rounds` > 1: each point's requests are sent `rounds` times per model, the models alternating in
    order (`round_orders`); a point pools its rounds (tokens over summed wall seconds, every request's
    TTFT / TPOT). One round measures DFlash first, then AR: on a shared VM whose speed drifts over
    minutes, that order alone would move the ratio."""
    points = []
    temperatures = sampling.get("temperatures") or [sampling.get("temperature", 0.0)]
    for temperature in temperatures:
        one = {"seed": sampling.get("seed", 0), "temperature": temperature}
        for concurrency in levels:
            batch = (prompts * (1 + (2 * concurrency) // max(1, len(prompts))))[: max(len(prompts), 2 * concurrency)]
            pooled = {model: ([], 0.0) for model in models}
            for order in round_orders(models, rounds):
                for model in order:
                    name = f"{model} c={concurrency}" + (f" T={temperature:g}" if len(temperatures) > 1 else "")
                    tick = progress_factory(name, len(batch)) if progress_factory else None
                    results, wall = _send(url, model, batch, concurrency, max_new_tokens, one, tick)
                    pooled[model] = (pooled[model][0] + results, pooled[model][1] + wall)
            points += [_point(model, concurrency, results, wall, temperature)
                       for model, (results, wall) in pooled.items()]
    return points


def scaling(points: list[ServedPoint], model: str = "dflash") -> dict[int, float]:
    """Total output tokens/s at each concurrency relative to concurrency 1 (at the first temperature and
    context length)."""
    first = (points[0].temperature, points[0].context_length) if points else None
    mine = {p.concurrency: p.output_tokens_per_s for p in points
            if p.model == model and (p.temperature, p.context_length) == first}
    base = mine.get(1)
    return {c: v / base for c, v in sorted(mine.items())} if base else {}
