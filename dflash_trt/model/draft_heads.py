"""What the drafter proposes from its final hidden rows: the draft-vocabulary head, the confidence cut
(`confident_drafts`), the greedy rule every drafting path shares (the C++ twin is `cpu_ops.greedy_drafts`),
and coupled drafts for sampled requests (`coupled_drafts`).

Coupled drafts. A greedy draft against a sampled target is accepted with probability p_target(draft),
which collapses on flat distributions. At T > 0 the drafter instead proposes, at each block slot, the
token the sampling rule (decoding/sampling.py) would pick from the DRAFT's logits with the request's
own noise at that absolute position:

    d_j = argmax_v  q_j[v] / T + g(seed, start + j, v)      over the draft's top-k / top-p survivors,

the same g the target's verification uses for the token at start + j. Verification is unchanged, so
the committed tokens stay the target's own (token-identical to AR for the same seed); the drafts match
whenever the two argmaxes agree, with probability >= (1 - TV(p, q)) / (1 + TV(p, q)) (Daliri et al.,
"Coupling without communication"; shared/reference/ecosystem-2026-12.md): 1 when q = p.
"""

from __future__ import annotations

import math

import torch

from dflash_trt.model import cpu_ops
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


def coupled_drafts(logits: torch.Tensor, start: torch.Tensor, sampling, vocab_ids: torch.Tensor | None = None):
    """Drafts [B, K] (column indices of `logits`) for block slots 1..K: the sampling rule on the draft logits
    [B, K, V] with each row's (T, top_k, top_p, seed) at absolute positions start+1 .. start+K (slot j is
    verified against the target's token at start + j); greedy rows (T = 0) take the argmax."""
    from dflash_trt.kernels import sample_tokens  # the rule: torch, or its C++ twin for sampled CPU rows

    b, k, v = logits.shape
    positions = start[:, None] + 1 + torch.arange(k, device=logits.device)[None, :]
    temperature, top_k, top_p, seed = sampling
    return sample_tokens(logits.reshape(b * k, v), positions.reshape(-1), temperature.repeat_interleave(k),
                         top_k.repeat_interleave(k), top_p.repeat_interleave(k), seed.repeat_interleave(k),
                         vocab_ids).view(b, k)


def any_sampled(sampling) -> bool:
    return sampling is not None and bool((sampling[0] > 0).any())


def confident_prefix(logits: torch.Tensor, columns: torch.Tensor, temperature: torch.Tensor,
                     min_confidence: float, running: torch.Tensor | None = None) -> tuple[int, torch.Tensor]:
    """(K', running) for drafts `columns` [B, K] of `logits` [B, K, V] under the confidence cut: K' the slots
    some row still trusts (at least 1), each slot's trust being the draft's probability of its token
    (softmax at the row's temperature; a greedy row's is its max probability, as in `confident_drafts`),
    multiplied along the block from `running` [B] (log, the slots before these; 0 by default); `running`
    returned is each row's log product after the last slot."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    b, k, v = logits.shape
    log_q = cpu_ops.sampled_trust(logits.reshape(b * k, v), columns.reshape(-1), t.repeat_interleave(k))
    if log_q is None:  # elsewhere the same in torch (on CPU the C++ one is what the draft step adds up)
        log_q = torch.log_softmax(logits.float() / t[:, None, None], dim=-1).gather(-1, columns[..., None])[..., 0]
    product = log_q.view(b, k).nan_to_num(nan=float("-inf")).cumsum(dim=1)
    if running is not None:
        product = product + running[:, None]
    if min_confidence <= 0.0:
        return columns.shape[1], product[:, -1]
    kept = int((product >= math.log(min_confidence)).sum(dim=1).max())
    return max(1, kept) if running is None else kept, product[:, -1]
