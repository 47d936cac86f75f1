"""The runner contract (runtime/runner.py) over the torch models: `TorchTargetRunner`, `TorchDraftRunner`.

Slots index static per-slot caches, so rewinding a slot is a length change. The verification and
sampling bodies come from `kernels.select` when the runners are built (the CUDA kernel, its C++ twin
or torch); nothing here asks again. The CPU backend subclasses both to run the passes in C++.

Deferred draft context. The draft runner keeps the context of committed tokens (their target_hidden,
positions, validity) pending until the next draft pass over the same slots, which stores it in the
same pass (one projection per layer for context and block): after a verify step that is the step's
committed rows; after autoregressive steps (width 1, no draft pass) it is all of theirs at once.
Any other call order stores the pending context first.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from dflash_trt.backends.torch.graphs import PassGraphs, graph_slots, keys_bucket
from dflash_trt.decoding.bad_words import mask_banned
from dflash_trt.decoding.batch import Rows, pad_prompts
from dflash_trt.decoding.drafts import DraftOps, propose
from dflash_trt.kernels import Kernels, select
from dflash_trt.model.kv_cache import BlockPool

Sampling = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # temperature, top_k, top_p, seed [B]
PREFILL_CHUNK_CPU, PREFILL_CHUNK_GPU = 512, 4096  # prompt positions a target prefills per engine step


class PrefixBlocks:
    """A runner's side of the prefix cache (runtime/prefix_cache.py): its cache's K/V of cached blocks, kept in a
    block pool the scheduler's index addresses by id. Mixed into both runners: the target keeps its K/V, the
    drafter its context K/V, of the same positions."""

    pool: BlockPool | None = None

    def prefix_block_bytes(self, block: int) -> int:
        return BlockPool.bytes_per_block(self.cache, block)

    def enable_prefix_cache(self, n_blocks: int, block: int) -> None:
        self.pool = BlockPool(self.cache, n_blocks, block)

    def save_prefix(self, slot: int, blocks: list[tuple[int, int]]) -> None:
        """Keep the slot's committed positions of block i in pool block b, for each (i, b)."""
        self.pool.save(self.cache, slot, blocks)

    def load_prefix(self, slot: int, ids: list[int]) -> None:
        """Restore pool blocks `ids` as the slot's first positions (before its prompt's prefill)."""
        self.pool.load(self.cache, slot, ids)


class TorchTargetRunner(PrefixBlocks):
    supports_bad_words = True  # prefill / verify take `bans` (decoding/bad_words.py)

    def __init__(self, target, n_slots: int, capacity: int, tap_layers: tuple[int, ...], kernels: Kernels | None = None,
                 graphs: bool = False):
        self.target, self.tap_layers = target, tuple(tap_layers)
        self.cache = target.new_cache(n_slots, capacity)
        self.device = target.lm_head.weight.device
        self.vocab_size = target.config.vocab_size
        self.kernels = kernels or select(self.device)
        self.graphs = PassGraphs() if graphs else None  # verify passes as CUDA graphs (graphs.py)
        # a longer prompt is prefilled a chunk per engine step (runtime/scheduler.py): a CPU does ~512 rows of an
        # 8k-token prompt in about a second, a GPU several thousand in milliseconds
        self.prefill_chunk = PREFILL_CHUNK_CPU if self.device.type == "cpu" else PREFILL_CHUNK_GPU

    def forward(self, tokens, positions, slots, logit_rows=None, head: bool = True, rows: Rows | None = None):
        """The target's pass over these slots' cache: logits (or final-norm hidden) and taps."""
        return self.target(tokens, positions, self.cache, slots, self.tap_layers, logit_rows, head, rows)

    @torch.inference_mode()
    def prefill(self, slots: torch.Tensor, prompts: list[tuple[int, ...]], sampling: Sampling, bans=None,
                cached: list[int] | None = None):
        """-> first tokens [B], taps [B, T, n*H], positions [B, T], lengths [B] (full prompt lengths). `cached`:
        each row's first positions already in its slot (a prefix-cache hit): only the rest runs, and the taps
        and positions returned are the rest's."""
        cached = cached or [0] * len(prompts)
        tokens, positions, rest = pad_prompts([p[c:] for p, c in zip(prompts, cached)], self.device)
        offsets = torch.tensor(cached, dtype=torch.int64, device=self.device)
        positions, lengths = positions + offsets[:, None], rest + offsets
        logits, taps = self.forward(tokens, positions, slots, logit_rows=(rest - 1)[:, None])
        self.cache.crop(slots, lengths)
        if bans is not None:
            mask_banned(logits, bans)
        return self.kernels.sample_tokens(logits[:, 0], lengths, *sampling), taps, positions, lengths

    @torch.inference_mode()
    def verify(self, slots: torch.Tensor, blocks: torch.Tensor, start: torch.Tensor, sampling: Sampling, bans=None,
               rows: Rows | None = None):
        """blocks [B, K+1] = [bonus, d_1 .. d_K] at `start` -> tokens [B, K+1], accepted [B], taps. `bans`
        (optional): per row, per block row, the token ids the rule must not choose there. `rows`: the same rows
        as the host knows them (then no device value is read back); with them a runner with graphs replays the
        pass from a CUDA graph."""
        rows = rows and replace(rows, width=blocks.shape[1])
        if self.graphs is not None and rows is not None and bans is None:
            keys = keys_bucket(rows.end, self.cache.capacity)
            fixed = replace(rows, keys=keys)
            return self.graphs.run(("verify", graph_slots(rows), rows.width, keys, rows.sampled),
                                   lambda s, b, p, *rule: self._verify(s, b, p, rule, None, fixed),
                                   (slots, blocks, start, *sampling))
        return self._verify(slots, blocks, start, sampling, bans, rows)

    def _verify(self, slots, blocks, start, sampling, bans, rows):
        sampled = None if rows is None else rows.sampled
        positions = start[:, None] + torch.arange(blocks.shape[1], device=self.device)[None, :]
        logits, taps = self.forward(blocks, positions, slots, rows=rows)
        if bans is not None:
            mask_banned(logits, bans)
        if blocks.shape[1] == 1:  # an AR step: the token at start + 1 by the sampling rule
            tokens = self.kernels.sample_tokens(logits[:, 0], start + 1, *sampling, sampled=sampled)[:, None]
            return tokens, torch.zeros(blocks.shape[0], dtype=torch.int64, device=self.device), taps
        tokens, accepted = self.kernels.verify_block(logits, blocks[:, 1:], start, *sampling, sampled=sampled)
        return tokens, accepted, taps

    def commit(self, slots: torch.Tensor, lengths: torch.Tensor) -> None:
        self.cache.crop(slots, lengths)


def merge_context(parts: list[tuple]) -> tuple | None:
    """Pending contexts (slots, target_hidden [B, T, n*H], positions [B, T], valid [B, T]) of the same slots,
    oldest first, as one (None for none). Each part's valid entries are a prefix of its row (a prompt's right
    padding, a step's rejected drafts); joined they are not (a step's rejected drafts sit between its committed
    rows and the next step's), so each row's valid entries are moved to the front in position order: a
    one-sequence draft pass reads a row's context as its valid prefix."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    hidden, positions, valid = (torch.cat(fields, dim=1) for fields in zip(*(part[1:] for part in parts)))
    counts = valid.sum(dim=1)
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices[:, : int(counts.max())]
    hidden = hidden.gather(1, order[..., None].expand(-1, -1, hidden.shape[-1]))
    kept = torch.arange(order.shape[1], device=valid.device)[None, :] < counts[:, None]
    return parts[-1][0], hidden, positions.gather(1, order), kept


def same_slots(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two slot tensors hold the same slots. The scheduler hands the same tensor for the same set, so on a
    GPU identity answers without reading the device back; a miss there only stores the context in a pass of its
    own (the same K/V)."""
    return a is b or (not a.is_cuda and a.shape == b.shape and torch.equal(a, b))


class TorchDraftRunner(PrefixBlocks):
    def __init__(self, draft, target, n_slots: int, capacity: int, block_size: int, min_confidence: float = 0.0,
                 kernels: Kernels | None = None, graphs: bool = False):
        self.draft, self.target, self.block_size = draft, target, block_size
        self.min_confidence = min_confidence  # > 0: propose only confident drafts (decoding/drafts.py)
        self.cache = draft.new_cache(n_slots, capacity)
        self.device = target.lm_head.weight.device
        self.mask_token_id = draft.config.mask_token_id
        self.kernels = kernels or select(self.device)
        self.pending: list[tuple] = []  # (slots, taps, positions, valid) of the same slots, not yet stored
        self.backlog = False  # the last propose also stored AR steps' context (the width policy does not time it)
        # draft passes as CUDA graphs (graphs.py), where a graph can hold them: no confidence cut, no DFlash2 walk
        self.graphs = PassGraphs() if graphs and min_confidence <= 0.0 and draft.candidate_selector is None else None

    @torch.inference_mode()
    def append_context(self, slots, taps, positions, valid) -> None:
        """Deferred: the next `propose` over the same slots stores it in its own pass; a context of other
        slots stores what is pending first."""
        if self.pending and same_slots(self.pending[-1][0], slots):
            self.pending.append((slots, taps, positions, valid))
            return
        self._store(merge_context(self.pending))
        self.pending = [(slots, taps, positions, valid)]

    def _store(self, context: tuple | None) -> None:
        if context is not None:
            slots, taps, positions, valid = context
            self.draft.append_context(taps, positions, self.cache, slots, valid, on_device=self.device.type != "cpu")

    def _take(self, slots: torch.Tensor) -> tuple | None:
        """The pending context as a draft pass over `slots` takes it (stored first if of other slots)."""
        context, self.pending = merge_context(self.pending), []
        if context is None:
            return None
        if same_slots(context[0], slots):
            return context[1:]
        self._store(context)
        return None

    @torch.inference_mode()
    def propose(self, slots: torch.Tensor, bonus: torch.Tensor, start: torch.Tensor,
                block_size: int | None = None, sampling=None, rows: Rows | None = None) -> torch.Tensor:
        """Drafts [B, K' <= block_size - 1] for blocks [bonus, MASK x K] opened at `start` (K may vary per
        step; K' < K when the drafter is not confident past K'). `sampling` (T, top_k, top_p, seed [B]):
        rows with T > 0 get coupled drafts. `rows`: the same rows as the host knows them (then no device value
        is read back)."""
        width = min(block_size or self.block_size, self.block_size)
        if rows is not None:
            rows = replace(rows, width=width)
            sampling = sampling if rows.sampled else None  # all greedy: argmax drafts, nothing asks the tensors
        self.backlog = len(self.pending) > 1
        context = self._take(slots)
        block = torch.full((slots.numel(), width), self.mask_token_id, dtype=torch.int64, device=self.device)
        block[:, 0] = bonus
        positions = start[:, None] + torch.arange(width, device=self.device)[None, :]
        if self.graphs is not None and rows is not None and (context is None or context[0].shape[1] <= self.block_size):
            return self._graphed(block, positions, slots, context, sampling, bonus, rows)
        return self.draft_block(self.target.embed(block), positions, slots, context, sampling, bonus, rows)

    def _graphed(self, block, positions, slots, context, sampling, bonus, rows) -> torch.Tensor:
        """The draft pass from a CUDA graph per key (a verify step's context, of its width, or none)."""
        keys = keys_bucket(rows.end, self.cache.capacity)
        fixed = replace(rows, keys=keys)
        shape = None if context is None else (context[0].shape[1], context[2] is None)
        n_rule = 0 if sampling is None else len(sampling)

        def drafts(block, positions, slots, bonus, *rest):
            rule, ctx = (tuple(rest[:n_rule]) or None), rest[n_rule:]
            ctx = None if not ctx else (ctx[0], ctx[1], ctx[2] if len(ctx) > 2 else None)
            return (self.draft_block(self.target.embed(block), positions, slots, ctx, rule, bonus, fixed),)

        inputs = (block, positions, slots, bonus, *(sampling or ()),
                  *(() if context is None else (t for t in context if t is not None)))
        return self.graphs.run(("draft", graph_slots(rows), rows.width, keys, rows.sampled, shape), drafts, inputs)[0]

    def draft_block(self, noise_embedding, positions, slots, context, sampling, anchor, rows=None) -> torch.Tensor:
        """One draft pass over the block (and the pending context), then the proposals."""
        hidden = self.draft(noise_embedding, positions, self.cache, slots, context, rows)
        return propose(self.draft, hidden[:, 1:], self.target.lm_head, positions[:, 0], sampling, anchor,
                       self.min_confidence, DraftOps(sample=self.kernels.sample_tokens),
                       None if rows is None else rows.sampled)

    def commit(self, slots: torch.Tensor, lengths: torch.Tensor) -> None:
        self.cache.crop(slots, lengths)  # lengths only: a pending context stays pending

    def stored_length(self, slot: int) -> int:
        """Positions 0 .. n-1 of the slot hold final context K/V (later committed ones are still pending)."""
        pending = [int(positions[row][valid[row]].min()) for slots, _, positions, valid in self.pending
                   for row, s in enumerate(slots.tolist()) if s == slot and bool(valid[row].any())]
        return min(pending, default=int(self.cache.lengths[slot]))

    def load_prefix(self, slot: int, ids: list[int]) -> None:
        """Pending contexts are stored first: one of a finished request in this slot must not land on the
        restored blocks."""
        self._store(merge_context(self.pending))
        self.pending = []
        super().load_prefix(slot, ids)
