"""A running DFlash service: runners + scheduler + its thread, built from a loaded pair.

This is what the Triton orchestrator holds (and what tests drive without Triton): `submit`
streams events to a sink from the scheduler thread; `generate` is the blocking convenience.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass

import torch

from dflash_trt.decoding.requests import GenerationResult, Request
from dflash_trt.runtime.local import LoadedPair
from dflash_trt.runtime.runner import TorchDraftRunner, TorchTargetRunner
from dflash_trt.runtime.scheduler import Event, Scheduler, Sequence, StepStats


@dataclass(frozen=True)
class ServiceLimits:
    max_batch_size: int = 8  # slots decoded together
    max_seq_len: int = 1024  # prompt + generated tokens per request
    block_size: int | None = None  # default: the drafter's; 1 = autoregressive (no drafter)
    block_size_schedule: dict[int, int] | None = None  # {batch size: smaller block size} for busy steps
    adaptive_width_cost: float | None = None  # step cost in verified tokens: pick widths from acceptance
    draft_confidence: float = 0.0  # > 0: verify only the drafts the drafter trusts this much (confident_drafts)
    width_policy: str = "auto"  # decoding/width.py WIDTH_POLICIES: "schedule", "measured" (MeasuredWidth), "auto"


def torch_runners(pair: LoadedPair, limits: ServiceLimits):
    """Torch target / draft runners for a loaded pair (no drafter when block_size is 1)."""
    block_size = limits.block_size or (pair.draft.config.block_size if pair.draft is not None else 1)
    if block_size > 1 and pair.draft is None:
        raise ValueError("block_size > 1 needs a drafter")
    capacity = limits.max_seq_len + block_size + 1
    taps = pair.draft.config.target_layer_ids if block_size > 1 else ()
    target = TorchTargetRunner(pair.target, limits.max_batch_size, capacity, taps)
    draft = TorchDraftRunner(pair.draft, pair.target, limits.max_batch_size, capacity, block_size,
                             limits.draft_confidence) if block_size > 1 else None
    return target, draft


class DFlashService:
    """The scheduler thread over a pair of runners (torch by default; any backend's runners work)."""

    def __init__(self, pair: LoadedPair | None, limits: ServiceLimits = ServiceLimits(), on_step=None,
                 runners=None, detokenize=None):
        self.pair, self.limits = pair, limits
        target, draft = runners if runners is not None else torch_runners(pair, limits)
        if detokenize is None and pair is not None and pair.tokenizer is not None:
            detokenize = pair.detokenize
        block = draft.block_size if draft is not None else 1
        capacity = limits.max_seq_len + block + 1
        self.scheduler = Scheduler(target, draft, limits.max_batch_size, capacity, detokenize,
                                   device=target.device, on_step=on_step,
                                   block_size_schedule=limits.block_size_schedule,
                                   adaptive_width_cost=limits.adaptive_width_cost, width_policy=limits.width_policy)
        self.thread = threading.Thread(target=self._run, name="dflash-scheduler", daemon=True)
        self.error: BaseException | None = None
        self.thread.start()

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        try:
            self.scheduler.run()
        except BaseException as exc:  # surface to callers instead of dying silently
            self.error = exc
            raise

    def submit(self, request: Request, sink, is_cancelled=None) -> Sequence:
        if self.error is not None:
            raise RuntimeError(f"the scheduler thread failed: {self.error!r}")
        return self.scheduler.submit(request, sink, is_cancelled)

    def generate(self, requests: list[Request], timeout: float = 600.0) -> list[GenerationResult]:
        """Submit all requests at once and wait for every final result."""
        done: queue.Queue = queue.Queue()
        for i, request in enumerate(requests):
            self.submit(request, lambda e, i=i: done.put((i, e)) if e.finished else None)
        results: list[GenerationResult | None] = [None] * len(requests)
        for _ in requests:
            i, event = done.get(timeout=timeout)
            results[i] = event.result
        return results

    def shutdown(self) -> None:
        self.scheduler.stop()
        self.thread.join(timeout=30)


__all__ = ["DFlashService", "ServiceLimits", "Event", "StepStats"]
