"""Drafters that propose a known continuation with seeded corruption (exercise acceptance).

Draft slot j of a block opened at position p proposes `script[p + j]` (the true continuation,
taken from autoregressive decoding), replaced by another token when `corrupted(seed, pos)`.
The corruption depends only on (seed, position), so our drafter and z-lab's reference drafter
can be scripted identically. Every real draft forward still runs; only proposals are replaced.
"""

from __future__ import annotations

import random

import torch

from dflash_trt.model.draft_heads import confident_drafts


def scripted_token(script: list[int], pos: int, corrupt: float, seed: int, vocab: int) -> int:
    token = script[pos] if pos < len(script) else 0
    rng = random.Random(seed * 1_000_003 + pos)
    if rng.random() < corrupt:
        token = (token + 1 + rng.randrange(vocab - 1)) % vocab
    return token


def scripted_sharpness(pos: int, seed: int) -> float:
    """A seeded logit height in [4, 16) per position: draft confidences from ~0.01 to ~1."""
    return 4.0 + 12.0 * random.Random(seed * 7_000_003 + pos).random()


def scripted_logits(shape, like, scripts, slots, starts, corrupt, seed, sharp=False):
    """One-hot logits [n, K, V]: row r proposes scripted tokens at positions starts[r]+1 ....
    `sharp`: the hot logit is `scripted_sharpness` instead of 1 (varied draft confidence)."""
    out = torch.zeros(shape, dtype=like.dtype)
    for row, (slot, start) in enumerate(zip(slots, starts)):
        for j in range(shape[1]):
            pos = start + 1 + j
            hot = scripted_sharpness(pos, seed + slot) if sharp else 1.0
            out[row, j, scripted_token(scripts[slot], pos, corrupt, seed + slot, shape[2])] = hot
    return out


class ScriptedDraft:
    """Wraps our `DFlashDraft`; `scripts[slot]` is the full token sequence (prompt + output)."""

    def __init__(self, draft, scripts: list[list[int]], corrupt: float, seed: int = 0, sharp: bool = False):
        self.draft, self.scripts, self.corrupt, self.seed, self.sharp = draft, scripts, corrupt, seed, sharp
        self.config = draft.config
        self._last = None
        self.widths: list[int] = []  # drafts proposed per call (after any confidence cut)

    def new_cache(self, *args):
        return self.draft.new_cache(*args)

    def append_context(self, *args, **kwargs):
        return self.draft.append_context(*args, **kwargs)

    def take_context(self, *args):
        return self.draft.take_context(*args)

    def __call__(self, noise_embedding, block_positions, cache, slots, context=None):
        self._last = (slots.tolist(), block_positions[:, 0].tolist())
        return self.draft(noise_embedding, block_positions, cache, slots, context)

    def draft_block(self, noise_embedding, block_positions, cache, slots, context, lm_head, min_confidence=0.0,
                    sampling=None, anchor=None):
        """`DFlashDraft.draft_block` as a whole pass, then the scripted proposals (the script, whatever the
        requests' sampling: scripted drafts exercise acceptance, not the coupling)."""
        hidden = self(noise_embedding, block_positions, cache, slots, context)
        return self.propose(hidden[:, 1:], lm_head, min_confidence)

    def logits(self, hidden, lm_head, first_slot: int = 0):
        real = self.draft.logits(hidden, lm_head)
        slots, starts = self._last
        return scripted_logits(real.shape, real, self.scripts, slots, [s + first_slot for s in starts],
                               self.corrupt, self.seed, self.sharp)

    def propose(self, hidden, lm_head, min_confidence: float = 0.0, start=None, sampling=None):
        """`DFlashDraft.propose` over the scripted logits (same chunks and confidence cut)."""
        drafts = confident_drafts(lambda lo, hi: self.logits(hidden[:, lo:hi], lm_head, lo), hidden.shape[1],
                                  min_confidence)
        self.widths.append(drafts.shape[1])
        return drafts


def script_oracle(oracle, script: list[int], corrupt: float, seed: int = 0):
    """Patch a z-lab `DFlashDraftModel` instance (batch 1) to propose like `ScriptedDraft`."""
    forward, state = oracle.forward, {}

    def scripted_forward(*args, **kwargs):
        q_len = kwargs["noise_embedding"].shape[1]
        state["start"] = int(kwargs["position_ids"][0, -q_len])
        return forward(*args, **kwargs)

    def scripted_compute_logits(hidden, head):
        real = head(hidden)
        return scripted_logits(real.shape, real, [script], [0], [state["start"]], corrupt, seed)

    oracle.forward = scripted_forward
    oracle.compute_logits = scripted_compute_logits
    return oracle
