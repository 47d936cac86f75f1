"""Drafters that propose a known continuation with seeded corruption (exercise acceptance).

Draft slot j of a block opened at position p proposes `script[p + j]` (the true continuation,
taken from autoregressive decoding), replaced by another token when `corrupted(seed, pos)`.
The corruption depends only on (seed, position), so our drafter and z-lab's reference drafter
can be scripted identically. Every real draft forward still runs; only proposals are replaced.

- `ScriptedDraft` wraps a `DFlashDraft` for the reference loop: pass it as the drafter and its
  `propose` as the loop's proposal rule (scripts indexed by request).
- `ScriptedRunner` wraps an engine's draft runner: the real runner drafts (context stored, passes
  run), then its drafts are replaced (scripts indexed by slot: request i gets slot i when the engine
  has at least as many slots as requests).
"""

from __future__ import annotations

import random

import torch

from dflash_trt.decoding.drafts import confident_drafts


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


class _Scripts:
    def __init__(self, scripts: list[list[int]], corrupt: float, seed: int = 0, sharp: bool = False):
        self.scripts, self.corrupt, self.seed, self.sharp = scripts, corrupt, seed, sharp
        self.widths: list[int] = []  # drafts proposed per call (after any confidence cut)

    def drafts(self, slots: list[int], starts: list[int], k: int, vocab: int, min_confidence: float) -> torch.Tensor:
        """Scripted drafts [n, K' <= k] for blocks opened at `starts`, with the confidence cut on the scripted
        logits (the same chunks and cut as the real drafter's greedy proposals)."""
        like = torch.empty(0)

        def logits_of(lo, hi):
            return scripted_logits((len(slots), hi - lo, vocab), like, self.scripts, slots, [s + lo for s in starts],
                                   self.corrupt, self.seed, self.sharp)

        drafts = confident_drafts(logits_of, k, min_confidence)
        self.widths.append(drafts.shape[1])
        return drafts


class ScriptedDraft(_Scripts):
    """Wraps our `DFlashDraft` for the reference loop; `scripts[i]` is request i's full token sequence
    (prompt + output). `speculative_generate(target, scripted, requests, propose=scripted.propose)`."""

    def __init__(self, draft, scripts: list[list[int]], corrupt: float, seed: int = 0, sharp: bool = False):
        super().__init__(scripts, corrupt, seed, sharp)
        self.draft, self.config = draft, draft.config
        self._last = None

    def new_cache(self, *args):
        return self.draft.new_cache(*args)

    def append_context(self, *args, **kwargs):
        return self.draft.append_context(*args, **kwargs)

    def __call__(self, noise_embedding, block_positions, cache, slots, context=None):
        self._last = (slots.tolist(), block_positions[:, 0].tolist())
        return self.draft(noise_embedding, block_positions, cache, slots, context)

    def propose(self, draft, hidden, lm_head, start, sampling=None, anchor=None, min_confidence=0.0, ops=None):
        """The scripted proposals for the last forward's rows (whatever the requests' sampling: scripted
        drafts exercise acceptance, not the coupling)."""
        slots, starts = self._last
        return self.drafts(slots, starts, hidden.shape[1], lm_head.weight.shape[0], min_confidence)


class ScriptedRunner(_Scripts):
    """Wraps an engine's draft runner; `scripts[slot]` is the full token sequence of the request in that slot."""

    def __init__(self, runner, scripts: list[list[int]], corrupt: float, seed: int = 0, sharp: bool = False):
        super().__init__(scripts, corrupt, seed, sharp)
        self.runner, self.block_size = runner, runner.block_size
        self.vocab = runner.target.lm_head.weight.shape[0]

    def __getattr__(self, name):  # append_context, commit, backlog, cache, ... are the real runner's
        return getattr(self.runner, name)

    def propose(self, slots, bonus, start, block_size=None, sampling=None, rows=None):
        self.runner.propose(slots, bonus, start, block_size, sampling, rows=rows)  # the real passes (context stored)
        k = min(block_size or self.block_size, self.block_size) - 1
        return self.drafts(slots.tolist(), start.tolist(), k, self.vocab, self.runner.min_confidence)


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
