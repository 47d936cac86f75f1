"""What the drafter proposes from its final hidden rows: the draft-vocabulary head and the
confidence cut (`confident_drafts`), the greedy rule every drafting path shares (the C++ twin is
`cpu_ops.greedy_drafts`)."""

from __future__ import annotations

import math

import torch

from dflash_trt.model.layers import linear


class VocabHead:
    """A draft-vocabulary head: the target lm_head's rows of the draft vocabulary (not a parameter)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)


CONFIDENCE_FIRST = 6  # slots the confidence cut reads before deciding whether to read the rest


def confident_drafts(logits_of, k: int, min_confidence: float = 0.0, first: int = CONFIDENCE_FIRST) -> torch.Tensor:
    """Greedy drafts [B, K'] from `logits_of(lo, hi)` -> draft logits [B, hi - lo, V] of slots lo+1..hi.

    With `min_confidence` <= 0: all K slots (K' = K). Otherwise the drafts stop after the last slot
    at which some row's running product of draft probabilities (the softmax max of each slot) is
    still >= min_confidence — the drafter's own estimate that the prefix survives verification (it
    is well calibrated, see docs/design-notes.md) — keeping at least one. The logits are then read
    in two chunks (`first` slots, then the rest, skipped once every row is below the threshold), and
    the verify pass gets a narrower block. Which tokens are committed never depends on K'.
    """
    if min_confidence <= 0.0 or k <= 1:
        return logits_of(0, k).argmax(dim=-1)
    floor = math.log(min_confidence)
    chunks, lo, kept, running = [], 0, k, None  # running: [B] log product of the slots so far
    while lo < k:
        hi = k if lo else min(k, first)
        logits = logits_of(lo, hi).float()  # [B, c, V]
        top, tokens = logits.max(dim=-1)
        log_p = (top - torch.logsumexp(logits, dim=-1)).nan_to_num(nan=float("-inf")).cumsum(dim=1)
        if running is not None:
            log_p = log_p + running[:, None]
        chunks.append(tokens)
        n = int((log_p >= floor).sum(dim=1).max())  # slots some row still trusts (a prefix per row)
        if n < hi - lo:
            kept = max(1, lo + n)
            break
        running, lo = log_p[:, -1], hi
    return torch.cat(chunks, dim=1)[:, :kept]
