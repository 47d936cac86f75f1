"""A running DFlash service: a scheduler over a pair of runners, stepped by its own thread.

This is what the Triton orchestrator holds (and what tests drive without Triton): `submit` streams
events to a sink from the scheduler thread; `generate` is the blocking convenience. The synchronous
twin, stepped in the caller's thread, is `generate.Engine`.
"""

from __future__ import annotations

import queue
import threading

import torch

from dflash_trt.decoding.requests import GenerationResult, Request
from dflash_trt.runtime.scheduler import Event, Scheduler, Sequence, ServiceLimits, StepStats


class DFlashService:
    """The scheduler thread over a pair of runners (`runners`, or a loaded pair's on its device)."""

    def __init__(self, pair=None, limits: ServiceLimits = ServiceLimits(), on_step=None, runners=None,
                 detokenize=None):
        from dflash_trt.runtime.backends import pair_runners

        self.pair, self.limits = pair, limits
        target, draft = runners if runners is not None else pair_runners(pair, limits)
        if detokenize is None and pair is not None and pair.tokenizer is not None:
            detokenize = pair.detokenize
        self.scheduler = Scheduler.from_limits(target, draft, limits, detokenize, on_step=on_step)
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
