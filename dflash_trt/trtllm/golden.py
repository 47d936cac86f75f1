"""Decode through any runner pair with the serving scheduler; golden outputs from that path.

`decode(target, draft, requests, ...)` submits every request to a `Scheduler` and steps it in the
calling thread until all are finished, so what it returns is exactly what the Triton model would
stream. `golden_outputs` records, for the trtllm backend, the same manifest block as
`engine/golden.compute_golden` (greedy DFlash outputs, acceptance lengths, a check against
autoregressive decoding), decoded through the built engines instead of the torch modules.
"""

from __future__ import annotations

from dflash_trt.decoding.requests import GenerationResult, Request, StopCriteria
from dflash_trt.engine.golden import golden_block
from dflash_trt.runtime.runner import DraftRunner, TargetRunner
from dflash_trt.runtime.scheduler import Event, Scheduler


def decode(target: TargetRunner, draft: DraftRunner | None, requests: list[Request], n_slots: int, capacity: int,
           device="cpu", detokenize=None, max_steps: int = 100_000,
           block_size_schedule: dict[int, int] | None = None, width_policy: str = "schedule") -> list[GenerationResult]:
    """Results in request order; `draft=None` decodes autoregressively (block of 1). Widths follow the schedule
    by default: a golden run is deterministic (measured widths depend on this machine's timings)."""
    scheduler = Scheduler(target, draft, n_slots, capacity, detokenize, device=device,
                          block_size_schedule=block_size_schedule, width_policy=width_policy)
    results: dict[int, GenerationResult] = {}
    errors: list[str] = []

    def sink_for(i: int):
        def sink(event: Event) -> None:
            if event.error:
                errors.append(event.error)
            if event.finished:
                results[i] = event.result
        return sink

    for i, request in enumerate(requests):
        scheduler.submit(request, sink_for(i))
    for _ in range(max_steps):
        if scheduler.idle:
            break
        scheduler.step()
    if errors:
        raise RuntimeError(f"decoding failed: {errors[0]}")
    if len(results) != len(requests):
        raise RuntimeError(f"decoding did not finish within {max_steps} steps")
    return [results[i] for i in range(len(requests))]


def golden_outputs(target: TargetRunner, draft: DraftRunner, ar_target: TargetRunner, prompts: list[list[int]],
                   max_new_tokens: int, block_size: int, n_slots: int, capacity: int, device="cpu") -> dict:
    """The manifest's `golden` block, decoded through `target` + `draft` (and `ar_target` alone)."""
    requests = [Request(tuple(p), stop=StopCriteria(max_new_tokens)) for p in prompts]
    spec = decode(target, draft, requests, n_slots, capacity, device)
    ar = decode(ar_target, None, requests, n_slots, capacity, device)
    return golden_block(prompts, spec, ar, max_new_tokens, block_size)
