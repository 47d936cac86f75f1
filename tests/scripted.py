"""Drafters that propose a known continuation with seeded corruption (exercise acceptance).

Draft slot j of a block opened at position p proposes `script[p + j]` (the true continuation,
taken from autoregressive decoding), replaced by another token when `corrupted(seed, pos)`.
The corruption depends only on (seed, position), so our drafter and z-lab's reference drafter
can be scripted identically. Every real draft forward still runs; only proposals are replaced.
"""

from __future__ import annotations

import random

import torch


def scripted_token(script: list[int], pos: int, corrupt: float, seed: int, vocab: int) -> int:
    token = script[pos] if pos < len(script) else 0
    rng = random.Random(seed * 1_000_003 + pos)
    if rng.random() < corrupt:
        token = (token + 1 + rng.randrange(vocab - 1)) % vocab
    return token


def scripted_logits(shape, like, scripts, slots, starts, corrupt, seed):
    """One-hot logits [n, K, V]: row r proposes scripted tokens at positions starts[r]+1 ...."""
    out = torch.zeros(shape, dtype=like.dtype)
    for row, (slot, start) in enumerate(zip(slots, starts)):
        for j in range(shape[1]):
            out[row, j, scripted_token(scripts[slot], start + 1 + j, corrupt, seed + slot, shape[2])] = 1.0
    return out


class ScriptedDraft:
    """Wraps our `DFlashDraft`; `scripts[slot]` is the full token sequence (prompt + output)."""

    def __init__(self, draft, scripts: list[list[int]], corrupt: float, seed: int = 0):
        self.draft, self.scripts, self.corrupt, self.seed = draft, scripts, corrupt, seed
        self.config = draft.config
        self._last = None

    def new_cache(self, *args):
        return self.draft.new_cache(*args)

    def append_context(self, *args, **kwargs):
        return self.draft.append_context(*args, **kwargs)

    def take_context(self, *args):
        return self.draft.take_context(*args)

    def __call__(self, noise_embedding, block_positions, cache, slots, context=None):
        self._last = (slots.tolist(), block_positions[:, 0].tolist())
        return self.draft(noise_embedding, block_positions, cache, slots, context)

    def logits(self, hidden, lm_head):
        real = self.draft.logits(hidden, lm_head)
        return scripted_logits(real.shape, real, self.scripts, *self._last, self.corrupt, self.seed)


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
