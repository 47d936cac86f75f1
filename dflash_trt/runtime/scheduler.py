"""The engine's step: a continuous-batching DFlash scheduler over a pair of runners (runner.py).

Requests join and leave a running batch between steps. One `step()`:
1. drop cancelled requests and free their slots;
2. admit waiting requests into free slots: one batched target prefill, first token chosen by the
   sampling rule, prompt taps handed to the draft runner as context; a prompt longer than the target
   runner's `prefill_chunk` is prefilled one chunk per step instead (the running requests decode between
   its chunks, so a long prompt delays them by a chunk's time, not its own);
3. one DFlash step for every running slot: the width policy picks the block (width.py), the draft
   runner drafts [bonus, MASK x K] in one pass, the target runner verifies it in one pass, the
   scheduler accepts the matching prefix + bonus, applies stops, streams, and rewinds both runners.
Each request keeps its own slot, positions, sampling params and seed, so its tokens are exactly
its autoregressive tokens whatever else shares the batch. A server steps it from a thread
(service.py); local decoding, benchmarks and golden outputs from the caller's (generate.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from dflash_trt.decoding.batch import Rows, StepInputs, to_device
from dflash_trt.decoding.requests import Detokenize, Request
from dflash_trt.runtime.prefix_cache import BLOCK, PrefixCache
from dflash_trt.runtime.runner import DraftRunner, TargetRunner
from dflash_trt.runtime.sequence import Event, Sequence, Sink, StepStats
from dflash_trt.runtime.width import MeasuredWidth, policy_for, resolve_policy, temperature_band


@dataclass(frozen=True)
class ServiceLimits:
    """What a running engine allows and how it picks widths (a bundle's `runtime` config)."""

    max_batch_size: int = 8  # slots decoded together
    max_seq_len: int = 1024  # prompt + generated tokens per request
    block_size: int | None = None  # default: the drafter's; 1 = autoregressive (no drafter)
    block_size_schedule: dict[int, int] | None = None  # {batch size: smaller block size} for busy steps
    draft_confidence: float = 0.0  # > 0: verify only the drafts the drafter trusts this much
    width_policy: str = "auto"  # runtime/width.py: "schedule", "measured", "auto" (measured on CPU)
    prefix_cache_bytes: int = 0  # K/V kept for prompts' cached prefixes (runtime/prefix_cache.py); 0: off
    cuda_graphs: bool = True  # on CUDA: draft and verify passes replayed as CUDA graphs (backends/torch/graphs.py)


log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, target: TargetRunner, draft: DraftRunner | None, n_slots: int, capacity: int,
                 detokenize: Detokenize | None = None, max_prefill_batch: int = 8, device="cpu",
                 on_step: Callable[[StepStats], None] | None = None,
                 block_size_schedule: dict[int, int] | None = None, width_policy: str = "auto",
                 prefix_cache_bytes: int = 0):
        self.target, self.draft, self.capacity = target, draft, capacity
        self.detokenize, self.max_prefill_batch, self.device = detokenize, max_prefill_batch, device
        self.on_step = on_step
        self.block_size = draft.block_size if draft is not None else 1  # no drafter: autoregressive
        device_type = torch.device(device).type
        self.width_policy = resolve_policy(width_policy, device_type)
        self.widths = policy_for(self.width_policy, device_type, self.block_size, block_size_schedule)
        self.free_slots = list(range(n_slots))
        self.waiting: deque[Sequence] = deque()
        self.running: dict[int, Sequence] = {}
        self.wakeup = threading.Condition()
        self.stopping = False
        self._admitting: list[Sequence] = []  # popped from waiting, not yet running (for failures)
        self.prefilling: deque[Sequence] = deque()  # admitted long prompts, prefilled a chunk per step
        self.prefill_chunk: int | None = getattr(target, "prefill_chunk", None)
        self.prefix = self._prefix_cache(prefix_cache_bytes)
        self._restored = 0  # prompt tokens restored from the prefix cache in this step's admissions
        self.inputs = StepInputs(device)

    @classmethod
    def from_limits(cls, target: TargetRunner, draft: DraftRunner | None, limits: ServiceLimits,
                    detokenize: Detokenize | None = None, on_step=None) -> Scheduler:
        """A scheduler for `limits` over these runners (slots, capacity, schedule and width policy)."""
        block = draft.block_size if draft is not None else 1
        return cls(target, draft, limits.max_batch_size, limits.max_seq_len + block + 1, detokenize,
                   device=target.device, on_step=on_step, block_size_schedule=limits.block_size_schedule,
                   width_policy=limits.width_policy, prefix_cache_bytes=limits.prefix_cache_bytes)

    def _prefix_cache(self, budget: int) -> PrefixCache | None:
        """The prefix cache's index, its blocks' pools set up in the runners, or None (off, no room for a
        block, or a runner without pools)."""
        runners = [r for r in (self.target, self.draft) if r is not None]
        if budget <= 0 or not all(hasattr(r, "enable_prefix_cache") for r in runners):
            return None
        n_blocks = budget // sum(r.prefix_block_bytes(BLOCK) for r in runners)
        if n_blocks < 1:
            return None
        for runner in runners:
            runner.enable_prefix_cache(n_blocks, BLOCK)
        return PrefixCache(n_blocks)

    @property
    def measured(self) -> MeasuredWidth | None:
        """The measured width policy, when that is the one in use."""
        return self.widths if isinstance(self.widths, MeasuredWidth) else None

    # --- requests ------------------------------------------------------------------------------
    def check(self, request: Request) -> None:
        """Raise ValueError if the request cannot fit a slot of this scheduler."""
        need = len(request.prompt) + request.stop.max_new_tokens + self.block_size + 1
        if need > self.capacity:
            raise ValueError(
                f"prompt ({len(request.prompt)} tokens) + max_tokens ({request.stop.max_new_tokens}) exceeds "
                f"the bundle's max_seq_len ({self.capacity - self.block_size - 1})"
            )
        bad = [t for t in request.prompt if not 0 <= t < self.target.vocab_size]
        if bad:
            raise ValueError(f"prompt token ids {bad[:5]} outside the vocabulary 0..{self.target.vocab_size - 1}")
        if request.bad_words and not getattr(self.target, "supports_bad_words", False):
            raise ValueError(f"bad_words: not supported by this bundle's target runner "
                             f"({type(self.target).__name__}); send the request without them")
        outside = [t for w in request.bad_words for t in w if not 0 <= t < self.target.vocab_size]
        if outside:
            raise ValueError(f"bad_words: token ids {outside[:5]} outside the vocabulary "
                             f"0..{self.target.vocab_size - 1}")

    def submit(self, request: Request, sink: Sink, is_cancelled: Callable[[], bool] | None = None) -> Sequence:
        self.check(request)
        seq = Sequence(request, sink, is_cancelled, self.detokenize)
        with self.wakeup:
            self.waiting.append(seq)
            self.wakeup.notify()
        return seq

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting and not self.prefilling

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> None:
        """Step until `stop()`; sleeps while there is nothing to do."""
        while True:
            with self.wakeup:
                while self.idle and not self.stopping:
                    self.wakeup.wait()
                if self.stopping:
                    return
            self.step()

    def stop(self) -> None:
        with self.wakeup:
            self.stopping = True
            self.wakeup.notify_all()

    def step(self) -> None:
        """One scheduler iteration. A failure ends the requests it touched, never the loop."""
        self._drop_cancelled()
        try:
            t0 = time.perf_counter()
            admitted = self._admit()
            t1 = time.perf_counter()
            step = self._decode() if self.running else (0.0, 0.0, [], 0, [], [])
            draft_s, verify_s, committed, drafts, accepted, warm = step
        except Exception as exc:  # noqa: BLE001 - report to the affected requests, keep serving
            log.exception("decode step failed")
            self._fail_running(f"internal error in the decode step: {exc!r}")
            return
        if self.on_step is not None:
            try:
                prefix = None if self.prefix is None else replace(self.prefix.stats)
                self.on_step(StepStats(len(committed), admitted, t1 - t0, draft_s, verify_s, committed,
                                       len(self.running), len(self.waiting), drafts, accepted, self._restored, warm,
                                       prefix, self._prefix_bytes()))
            except Exception:  # noqa: BLE001 - metrics must never stop decoding
                log.exception("on_step callback failed")

    def _fail_running(self, message: str) -> None:
        for seq in {id(s): s for s in [*self.running.values(), *self._admitting, *self.prefilling]}.values():
            if seq.slot is not None and seq.slot not in self.free_slots:
                self.free_slots.append(seq.slot)
            self.running.pop(seq.slot, None)
            seq.emit(Event([], finished=True, result=seq.row.result(), error=message))
        self._admitting, self.prefilling = [], deque()

    # --- internals -----------------------------------------------------------------------------
    def _drop_cancelled(self) -> None:
        with self.wakeup:
            waiting = list(self.waiting)
            self.waiting = deque(s for s in waiting if not self._cancelled(s))
        for seq in waiting:
            if seq.cancelled:
                seq.emit(Event([], finished=True, cancelled=True, result=seq.row.result()))
        for slot, seq in list(self.running.items()):
            if self._cancelled(seq):
                self._finish(seq, cancelled=True)
        for seq in [s for s in self.prefilling if self._cancelled(s)]:  # its slot's positions are never cached
            self.prefilling.remove(seq)
            self.free_slots.append(seq.slot)
            seq.emit(Event([], finished=True, cancelled=True, result=seq.row.result()))

    @staticmethod
    def _cancelled(seq: Sequence) -> bool:
        if not seq.cancelled and seq.is_cancelled is not None:
            try:
                seq.cancelled = bool(seq.is_cancelled())
            except Exception:
                seq.cancelled = True
        return seq.cancelled

    def _finish(self, seq: Sequence, cancelled: bool = False) -> None:
        if seq.row.finish_reason is None:
            seq.row.finish_reason = "cancelled" if cancelled else "length"
        self._keep_prefix(seq)
        self.running.pop(seq.slot, None)
        self.free_slots.append(seq.slot)
        seq.emit(Event([], finished=True, cancelled=cancelled, result=seq.row.result(), stats=seq.stats()))

    def _sampling(self, seqs: list[Sequence]):
        return self.inputs.sampling(tuple(s.id for s in seqs), [s.request.params for s in seqs])

    def _admit(self) -> int:
        """Admit waiting requests (prompts within a chunk prefilled together now, longer ones queued for
        chunks), then prefill one chunk of the longest-admitted long prompt; -> requests admitted."""
        self._restored = 0
        with self.wakeup:
            n = min(len(self.free_slots), len(self.waiting), self.max_prefill_batch)
            seqs = [self.waiting.popleft() for _ in range(n)]
        self._admitting = seqs
        for seq in seqs:
            seq.slot = self.free_slots.pop(0)
            if self.prefix is not None and seq.request.prefix_cache:
                seq.prefilled = self._restore_prefix(seq)
                self._restored += seq.prefilled
        long = [s for s in seqs if self.prefill_chunk and len(s.request.prompt) - s.prefilled > self.prefill_chunk]
        self.prefilling.extend(long)
        if len(long) < len(seqs):
            self._prefill([s for s in seqs if s not in long])
        if self.prefilling:
            self._admitting = [self.prefilling[0]]
            self._prefill(self._admitting, self.prefill_chunk)
            if self.prefilling[0].prefilled == len(self.prefilling[0].request.prompt):
                self.prefilling.popleft()
        self._admitting = []
        return n

    def _prefill(self, seqs: list[Sequence], chunk: int | None = None) -> None:
        """Prefill the rest of each prompt (or its next `chunk` positions) after the positions its slot holds; a
        prompt whose last position ran starts decoding with the first token the rule chose."""
        slots = self.inputs.slots(tuple(s.slot for s in seqs))
        ends = [len(s.request.prompt) if chunk is None else min(len(s.request.prompt), s.prefilled + chunk)
                for s in seqs]
        extra = {"bans": [s.request.bans([]) for s in seqs]} if any(s.request.bad_words for s in seqs) else {}
        if self.prefix is not None or any(s.prefilled for s in seqs):
            extra["cached"] = [s.prefilled for s in seqs]
        first, taps, positions, lengths = self.target.prefill(slots, [s.request.prompt[:e] for s, e in zip(seqs, ends)],
                                                              self._sampling(seqs), **extra)
        if self.draft is not None:
            self.draft.append_context(slots, taps, positions, positions < lengths[:, None])
            self.draft.commit(slots, lengths)
        now = time.perf_counter()
        for seq, token, end in zip(seqs, first.tolist(), ends):
            seq.prefilled = end
            if end == len(seq.request.prompt):
                seq.first_token_at, seq.bonus, seq.start = now, token, end
                self.running[seq.slot] = seq
                self._commit(seq, [token])

    def _restore_prefix(self, seq: Sequence) -> int:
        """Restore the longest cached prefix of the request's prompt into its slot (target K/V and the drafter's
        context alike; the last prompt token always runs: its logits choose the first new token); -> tokens."""
        prompt = seq.request.prompt
        ids = self.prefix.match(prompt, len(prompt) - 1)
        if ids:
            for runner in (self.target, self.draft):
                if runner is not None:
                    runner.load_prefix(seq.slot, ids)
        seq.row.cached_tokens = len(ids) * BLOCK
        return seq.row.cached_tokens

    def _keep_prefix(self, seq: Sequence) -> None:
        """Cache a finishing request's committed blocks: positions before its bonus token, whose K/V are final,
        and (with a drafter) whose context K/V the draft runner has stored."""
        if self.prefix is None or seq.slot is None or not seq.request.prefix_cache:
            return
        tokens = seq.request.prompt + tuple(seq.row.tokens)
        final = min(seq.start, len(tokens))  # tokens after a stop inside a block are not the sequence's
        if self.draft is not None:
            final = min(final, self.draft.stored_length(seq.slot))
        blocks = self.prefix.insert(tokens, final)
        if blocks:
            for runner in (self.target, self.draft):
                if runner is not None:
                    runner.save_prefix(seq.slot, blocks)

    def verify_width(self, batch: int, bands: list[int] | None = None) -> int:
        """Block size for a step of `batch` rows in temperature `bands` (1: verify the bonus token alone, an
        autoregressive step that keeps the draft context)."""
        return self.widths.width(bands if bands is not None else [0] * batch)

    def _commit(self, seq: Sequence, tokens: list[int], accepted: int | None = None, drafts: int = 0) -> int:
        """Commit target tokens (stops applied), record acceptance, stream, finish if done."""
        kept = seq.row.commit(tokens)
        if accepted is not None:
            seq.row.acceptance_lengths.append(kept)
            seq.row.accepted_drafts.append(accepted)
            seq.row.draft_tokens += drafts
        if kept:
            seq.emit(Event(seq.row.tokens[-kept:]))
        if seq.row.done or seq.cancelled:
            self._finish(seq, cancelled=seq.cancelled and not seq.row.done)
        return kept

    def _prefix_bytes(self) -> int:
        if self.prefix is None:
            return 0
        runners = [r for r in (self.target, self.draft) if r is not None]
        return self.prefix.used * sum(r.prefix_block_bytes(BLOCK) for r in runners)

    def _decode(self) -> tuple[float, float, list[int], int, list[int], list[bool]]:
        """One decode step: (draft s, verify s, tokens kept per row, drafts per row K, drafts accepted per row,
        whether each row's prompt restored a cached prefix)."""
        # ascending slots: a full batch is one consecutive slot range, whose cache read is a view (any other set
        # is a gather copy of every layer's K/V)
        seqs = [self.running[slot] for slot in sorted(self.running)]
        slots = self.inputs.slots(tuple(s.slot for s in seqs))
        bonus, start = to_device([[s.bonus for s in seqs], [s.start for s in seqs]], self.device)
        t0 = time.perf_counter()
        bands = [temperature_band(s.request.params.temperature) for s in seqs]
        width = min(self.verify_width(len(seqs), bands), max(s.row.remaining for s in seqs))  # the last blocks narrow
        sampling = self._sampling(seqs)
        rows = Rows(tuple(s.slot for s in seqs), tuple(s.start for s in seqs),
                    sampled=any(s.request.params.temperature > 0 for s in seqs))
        if self.draft is not None and width > 1:
            drafts = self.draft.propose(slots, bonus, start, width, sampling, rows=rows)  # [n, K]; sampled: coupled
        else:  # K = 0: a plain autoregressive step (no drafter, or a schedule entry of block 1)
            drafts = torch.zeros(len(seqs), 0, dtype=torch.int64, device=self.device)
        t1 = time.perf_counter()
        blocks = torch.cat([bonus[:, None], drafts], dim=1)
        extra = {}
        if any(s.request.bad_words for s in seqs):  # the rule's bans per row and block row
            extra["bans"] = [s.request.bans(s.row.tokens, block) for s, block in zip(seqs, blocks.tolist())]
        tokens, accepted, taps = self.target.verify(slots, blocks, start, sampling, rows=rows, **extra)
        t2 = time.perf_counter()
        new_start = start + accepted + 1
        self.target.commit(slots, new_start)
        if self.draft is not None:
            offsets = torch.arange(blocks.shape[1], device=self.device)[None, :]
            self.draft.append_context(slots, taps, start[:, None] + offsets, offsets <= accepted[:, None])
            self.draft.commit(slots, new_start)
        # the step's one read back: accepted counts and tokens together (each read waits for the device)
        read = torch.cat([accepted[:, None], tokens[:, : blocks.shape[1]]], dim=1).tolist()
        kept_per_row, accepted = [], [row[0] for row in read]
        for seq, (a, *row_tokens) in zip(seqs, read):
            seq.bonus, seq.start = row_tokens[a], seq.start + a + 1
            kept_per_row.append(self._commit(seq, row_tokens[: a + 1], a, drafts.shape[1]))
        # the whole step, commit and streaming included; a draft pass that also stored AR steps' context is not
        # timed (MeasuredWidth.update)
        backlog, spent = width > 1 and getattr(self.draft, "backlog", False), time.perf_counter() - t0
        self.widths.update(bands, accepted, width, None if backlog else spent, spent)
        warm = [s.row.cached_tokens > 0 for s in seqs]
        return t1 - t0, t2 - t1, kept_per_row, drafts.shape[1], accepted, warm
