"""One synchronous driver over the engine: what local `generate`, `bench`, golden outputs, `regress`,
`check-pair` and data regeneration decode with (nano-vllm's `LLM.generate`).

`Engine` holds a `Scheduler` over a pair of runners and steps it in the calling thread until every
submitted request has finished, so what it returns is exactly what a server running the same runners
would stream: the same admission, width policy, draft and verify passes, stops and commits. A server
runs the same scheduler in a thread (`service.DFlashService`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from dflash_trt.decoding.requests import GenerationResult, OnCommit, Request
from dflash_trt.decoding.stats import DecodeStats
from dflash_trt.runtime.scheduler import Event, Scheduler, ServiceLimits, StepStats


@dataclass
class Timings:
    """Seconds spent admitting requests (prefill) and in decode steps, summed over steps."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    steps: int = 0


class Engine:
    """A scheduler over `target` / `draft` runners (draft None: autoregressive), stepped synchronously."""

    def __init__(self, target, draft, limits: ServiceLimits, detokenize=None, max_steps: int = 1_000_000):
        self.limits, self.max_steps = limits, max_steps
        self.timings = Timings()
        self.scheduler = Scheduler.from_limits(target, draft, limits, detokenize, on_step=self._on_step)

    @property
    def block_size(self) -> int:
        return self.scheduler.block_size

    def _on_step(self, step: StepStats) -> None:
        self.timings.prefill_s += step.prefill_s
        self.timings.decode_s += step.draft_s + step.verify_s
        self.timings.steps += 1

    def generate(self, requests: list[Request], on_commit: OnCommit | None = None) -> list[GenerationResult]:
        """Decode `requests` to the end; one result per request, in order. `on_commit(i, tokens)` streams
        each request's newly committed tokens. A failed step raises (every request it touched is over)."""
        results: dict[int, GenerationResult] = {}
        errors: list[str] = []

        def sink_for(i: int):
            def sink(event: Event) -> None:
                if event.tokens and on_commit is not None:
                    on_commit(i, event.tokens)
                if event.error:
                    errors.append(event.error)
                if event.finished:
                    results[i] = event.result
            return sink

        for i, request in enumerate(requests):
            self.scheduler.submit(request, sink_for(i))
        for _ in range(self.max_steps):
            if self.scheduler.idle:
                break
            self.scheduler.step()
        if errors:
            raise RuntimeError(f"decoding failed: {errors[0]}")
        if len(results) != len(requests):
            raise RuntimeError(f"decoding did not finish within {self.max_steps} steps")
        return [results[i] for i in range(len(requests))]

    def generate_with_stats(self, requests: list[Request],
                            on_commit: OnCommit | None = None) -> tuple[list[GenerationResult], DecodeStats]:
        """`generate` plus its statistics (τ, per-position acceptance, prefill and decode seconds)."""
        before = Timings(**vars(self.timings))
        t0 = time.perf_counter()
        results = self.generate(requests, on_commit)
        wall = time.perf_counter() - t0
        prefill = self.timings.prefill_s - before.prefill_s
        return results, DecodeStats.of(results, self.block_size, prefill, max(wall - prefill, 0.0))


def capacity_for(requests: list[Request]) -> int:
    """The max_seq_len a local engine needs for these requests (prompt + new tokens of the longest)."""
    return max(len(r.prompt) + r.stop.max_new_tokens for r in requests)


def decode(target, draft, requests: list[Request], n_slots: int, block_size_schedule: dict[int, int] | None = None,
           width_policy: str = "schedule") -> list[GenerationResult]:
    """Decode `requests` through these runners with `n_slots` slots (draft None: autoregressive); widths follow
    the schedule by default, so the run is deterministic (measured widths follow this machine's timings)."""
    limits = ServiceLimits(n_slots, capacity_for(requests), draft.block_size if draft is not None else 1,
                           block_size_schedule, width_policy=width_policy)
    return Engine(target, draft, limits).generate(requests)
