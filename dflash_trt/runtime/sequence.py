"""A request as the engine holds it (`Sequence`: its row, slot, position and sink), what its sink receives
(`Event`) and what each engine step reports (`StepStats`)."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dflash_trt.decoding.requests import Detokenize, GenerationResult, Request, Row
from dflash_trt.runtime.prefix_cache import PrefixStats


@dataclass
class Event:
    """What a request's sink receives: newly committed tokens, then one final event."""

    tokens: list[int]
    finished: bool = False
    result: GenerationResult | None = None
    cancelled: bool = False
    stats: dict = field(default_factory=dict)
    error: str | None = None  # the step failed: this request is over, with this message


@dataclass
class StepStats:
    batch: int  # rows decoded this step
    admitted: int
    prefill_s: float
    draft_s: float
    verify_s: float
    committed: list[int]  # tokens committed per running row this step
    running: int = 0  # requests holding a slot after the step
    waiting: int = 0  # requests queued for a slot
    drafts: int = 0  # draft tokens proposed per row this step (K; 0 for an AR step)
    accepted: list[int] = field(default_factory=list)  # drafts accepted per row (before stops)
    cached_tokens: int = 0  # prompt tokens the admitted requests restored from the prefix cache
    warm: list[bool] = field(default_factory=list)  # per running row: its prompt restored a cached prefix
    prefix: PrefixStats | None = None  # the prefix cache's totals (None: no prefix cache)
    prefix_bytes: int = 0  # bytes of K/V the prefix cache holds


Sink = Callable[[Event], None]


class Sequence:
    """A request bound to the scheduler: its Row (tokens, stops), slot and decode position."""

    _ids = itertools.count()

    def __init__(self, request: Request, sink: Sink, is_cancelled, detokenize: Detokenize | None):
        self.id = next(self._ids)
        self.request, self.sink, self.is_cancelled = request, sink, is_cancelled
        self.row = Row(self.id, request, detokenize)
        self.slot: int | None = None
        self.bonus = 0  # last committed token, not yet run through the target
        self.start = 0  # its absolute position
        self.prefilled = 0  # prompt positions in its slot (restored or prefilled) while it is admitted
        self.submitted_at = time.perf_counter()
        self.first_token_at: float | None = None
        self.cancelled = False

    def emit(self, event: Event) -> None:
        try:
            self.sink(event)
        except Exception:  # a sink that cannot deliver (client gone) cancels its request
            self.cancelled = True

    def stats(self) -> dict:
        now = time.perf_counter()
        steps = self.row.acceptance_lengths
        return {
            "ttft_s": (self.first_token_at or now) - self.submitted_at,
            "total_s": now - self.submitted_at,
            "verify_steps": len(steps),
            "mean_acceptance_length": sum(steps) / len(steps) if steps else 0.0,
            "cached_tokens": self.row.cached_tokens,
        }
