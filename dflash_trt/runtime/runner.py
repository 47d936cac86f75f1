"""The runner contract (DESIGN §5) and its torch implementation.

The scheduler owns requests, slots, lengths and stop logic; a runner owns tensors and caches.
Slots index static per-slot caches, so rewinding a slot is only a length change.

- TargetRunner.prefill(slots, prompts, sampling) -> (first tokens [B], taps [B, T, n*H], positions [B, T], lengths [B])
- TargetRunner.verify(slots, blocks [B, K+1], start [B], sampling) -> (tokens [B, K+1], accepted [B], taps [B, K+1, n*H])
  (only tokens[:, :accepted + 1] are specified; a runner may leave later entries uncomputed)
- TargetRunner.commit(slots, lengths [B])
- prefill / verify take `bans=` (token ids banned per row and block row: bad words) on runners whose
  `supports_bad_words` is true; the scheduler refuses bad words on the others
- DraftRunner.append_context(slots, taps, positions, valid)
- DraftRunner.propose(slots, bonus [B], start [B], block_size=None) -> drafts [B, K]  (K <= block_size - 1 <= max;
  a runner may return fewer drafts than asked, e.g. only those its drafter is confident about)
- DraftRunner.commit(slots, lengths [B])

A backend (torch here; trtllm engines elsewhere) implements only these calls.
"""

from __future__ import annotations

from typing import Protocol

import torch

from dflash_trt.decoding.bad_words import mask_banned
from dflash_trt.decoding.batch import pad_prompts
from dflash_trt.decoding.decode import merge_context
from dflash_trt.decoding.verify import verify_lazily
from dflash_trt.kernels import sample_tokens, verify_block  # the one switch: CUDA kernel / C++ twin / torch
from dflash_trt.model.draft import DFlashDraft
from dflash_trt.model.target import Target

Sampling = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # temperature, top_k, top_p, seed [B]


class TargetRunner(Protocol):
    vocab_size: int

    def prefill(self, slots, prompts, sampling: Sampling): ...
    def verify(self, slots, blocks, start, sampling: Sampling): ...
    def commit(self, slots, lengths): ...


class DraftRunner(Protocol):
    block_size: int

    def append_context(self, slots, taps, positions, valid): ...
    def propose(self, slots, bonus, start, block_size=None, sampling=None): ...
    def commit(self, slots, lengths): ...


class TorchTargetRunner:
    def __init__(self, target: Target, n_slots: int, capacity: int, tap_layers: tuple[int, ...]):
        self.target, self.tap_layers = target, tuple(tap_layers)
        self.cache = target.new_cache(n_slots, capacity)
        self.device = target.lm_head.weight.device
        self.vocab_size = target.config.vocab_size

    supports_bad_words = True  # prefill / verify take `bans` (decoding/bad_words.py)

    @torch.inference_mode()
    def prefill(self, slots: torch.Tensor, prompts: list[tuple[int, ...]], sampling: Sampling, bans=None):
        tokens, positions, lengths = pad_prompts(prompts, self.device)
        logits, taps = self.target(tokens, positions, self.cache, slots, self.tap_layers,
                                   logit_rows=(lengths - 1)[:, None])
        self.cache.crop(slots, lengths)
        if bans is not None:
            mask_banned(logits, bans)
        return sample_tokens(logits[:, 0], lengths, *sampling), taps, positions, lengths

    @torch.inference_mode()
    def verify(self, slots: torch.Tensor, blocks: torch.Tensor, start: torch.Tensor, sampling: Sampling,
               bans=None):
        """`bans` (optional): per row, per block row, the token ids the rule must not choose there."""
        positions = start[:, None] + torch.arange(blocks.shape[1], device=self.device)[None, :]
        if blocks.shape[1] == 1:  # an AR step: the token at start + 1 by the sampling rule (verify_block's row 0)
            logits, taps = self.target(blocks, positions, self.cache, slots, self.tap_layers)
            if bans is not None:
                mask_banned(logits, bans)
            tokens = sample_tokens(logits[:, 0], start + 1, *sampling)[:, None]
            return tokens, torch.zeros(blocks.shape[0], dtype=torch.int64, device=self.device), taps
        if bans is not None:  # bad words: every row's logits, masked, then the rule
            logits, taps = self.target(blocks, positions, self.cache, slots, self.tap_layers)
            tokens, accepted = verify_block(mask_banned(logits, bans), blocks[:, 1:], start, *sampling)
            return tokens, accepted, taps
        if self.device.type == "cpu":  # lm_head only as far as drafts still match (see verify_lazily)
            hidden, taps = self.target(blocks, positions, self.cache, slots, self.tap_layers, head=False)
            tokens, accepted = verify_lazily(hidden, self.target.lm_head, blocks[:, 1:], start, *sampling,
                                             verify=verify_block)
            return tokens, accepted, taps
        logits, taps = self.target(blocks, positions, self.cache, slots, self.tap_layers)
        tokens, accepted = verify_block(logits, blocks[:, 1:], start, *sampling)
        return tokens, accepted, taps

    def commit(self, slots: torch.Tensor, lengths: torch.Tensor) -> None:
        self.cache.crop(slots, lengths)

    def embed_weight(self) -> torch.Tensor:
        return self.target.model.embed_tokens.weight


class TorchDraftRunner:
    def __init__(self, draft: DFlashDraft, target: Target, n_slots: int, capacity: int, block_size: int,
                 min_confidence: float = 0.0):
        self.draft, self.target, self.block_size = draft, target, block_size
        self.min_confidence = min_confidence  # > 0: propose only confident drafts (DFlashDraft.propose)
        self.cache = draft.new_cache(n_slots, capacity)
        self.device = target.lm_head.weight.device
        self.mask_token_id = draft.config.mask_token_id
        self.pending: list[tuple] = []  # (slots, taps, positions, valid) of the same slots not yet in the cache
        self.backlog = False  # the last propose stored AR steps' context too

    @torch.inference_mode()
    def append_context(self, slots, taps, positions, valid) -> None:
        """Deferred: the next `propose` over the same slots stores it in its own pass (one projection
        per layer for context and block); any other call order stores it first."""
        if self.pending and torch.equal(self.pending[-1][0], slots):  # after an AR step: one pass for all
            self.pending.append((slots, taps, positions, valid))
            return
        self.draft.take_context(merge_context(self.pending), self.cache, None)
        self.pending = [(slots, taps, positions, valid)]

    @torch.inference_mode()
    def propose(self, slots: torch.Tensor, bonus: torch.Tensor, start: torch.Tensor,
                block_size: int | None = None, sampling=None) -> torch.Tensor:
        """Drafts [B, K' <= block_size - 1] for blocks [bonus, MASK x K] opened at `start` (K may vary
        per step; K' < K when the drafter is not confident past K', see `min_confidence`). `sampling`
        (T, top_k, top_p, seed [B]): rows with T > 0 get coupled drafts (model/draft_heads.py)."""
        width = min(block_size or self.block_size, self.block_size)
        self.backlog = len(self.pending) > 1  # this pass also stores the context of AR steps (see MeasuredWidth)
        context, self.pending = self.draft.take_context(merge_context(self.pending), self.cache, slots), []
        block = torch.full((slots.numel(), width), self.mask_token_id, dtype=torch.int64, device=self.device)
        block[:, 0] = bonus
        positions = start[:, None] + torch.arange(width, device=self.device)[None, :]
        return self.draft.draft_block(self.target.embed(block), positions, self.cache, slots, context,
                                      self.target.lm_head, self.min_confidence, sampling, anchor=bonus)

    def commit(self, slots: torch.Tensor, lengths: torch.Tensor) -> None:
        self.cache.crop(slots, lengths)  # lengths only: a pending context stays pending
