"""Proposals: the drafts a drafter offers from its final hidden rows of block slots 1..K.

- greedy (T = 0): the argmax of the draft logits at each slot;
- coupled (T > 0): at slot j the token the sampling rule (sampling.py) would pick from the DRAFT's
  logits with the request's own noise at that absolute position,

      d_j = argmax_v  q_j[v] / T + g(seed, start + j, v)      over the draft's top-k / top-p survivors,

  the same g the target's verification uses for the token at start + j. The drafts match whenever the
  two argmaxes agree, with probability >= (1 - TV(p, q)) / (1 + TV(p, q)) (Daliri et al., "Coupling
  without communication"): 1 when q = p. A greedy draft against a sampled target is accepted with
  probability p_target(draft) instead, which collapses on flat distributions.
- the confidence cut (`min_confidence` > 0): only the leading drafts whose running product of draft
  probabilities is still >= min_confidence (the drafter's own estimate that the prefix survives
  verification), at least one; the verify pass then gets a narrower block.
- a DFlash2 drafter walks its candidate selector from the bonus token (model/dflash2.py).

Verification is unchanged by any of this: which tokens are committed never depends on the drafts.
Backends may compute the same numbers faster (`DraftOps`): a head's logits, the sampling rule, a pick's
trust.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from dflash_trt.decoding.sampling import sample_tokens

CONFIDENCE_FIRST = 6  # slots the confidence cut reads before deciding whether to read the rest


def torch_head(head, x: torch.Tensor) -> torch.Tensor:
    """A head's logits [N, V] for rows x [N, H]."""
    return head(x)


def torch_log_trust(logits: torch.Tensor, columns: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """log softmax(logits / t)[column] per row: logits [N, V], columns [N], temperature [N] > 0."""
    return torch.log_softmax(logits.float() / temperature[:, None], dim=-1).gather(-1, columns[:, None])[:, 0]


@dataclass(frozen=True)
class DraftOps:
    """How proposals compute: a head's logits, the sampling rule, the log-probability of a pick."""

    head: Callable = torch_head
    sample: Callable = sample_tokens
    log_trust: Callable = torch_log_trust


TORCH_OPS = DraftOps()


def any_sampled(sampling) -> bool:
    return sampling is not None and bool((sampling[0] > 0).any())


def draft_logits(draft, hidden: torch.Tensor, head, ops: DraftOps = TORCH_OPS) -> torch.Tensor:
    """Draft logits [..., V] of hidden rows [..., H] through `head` (the target's lm_head or a draft
    vocabulary's rows), with the drafter's output multiplier and softcap."""
    flat = hidden.to(head.weight.dtype).reshape(-1, hidden.shape[-1]).contiguous()
    return draft.scale_logits(ops.head(head, flat).view(*hidden.shape[:-1], -1))


def confident_drafts(logits_of, k: int, min_confidence: float = 0.0, first: int = CONFIDENCE_FIRST) -> torch.Tensor:
    """Greedy drafts [B, K'] from `logits_of(lo, hi)` -> draft logits [B, hi - lo, V] of slots lo+1..hi.

    Without the cut all K slots; with it, the logits are read in two chunks (`first` slots, then the rest,
    skipped once every row is below the threshold) and the drafts stop after the last slot some row trusts.
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


def coupled_drafts(logits: torch.Tensor, start: torch.Tensor, sampling, vocab_ids: torch.Tensor | None = None,
                   sample=sample_tokens) -> torch.Tensor:
    """Drafts [B, K] (column indices of `logits` [B, K, V]): the sampling rule with each row's (T, top_k,
    top_p, seed) at absolute positions start+1 .. start+K (slot j is verified against the target's token at
    start + j); greedy rows take the argmax. `vocab_ids`: the token id of each column (a draft vocabulary)."""
    b, k, v = logits.shape
    positions = start[:, None] + 1 + torch.arange(k, device=logits.device)[None, :]
    temperature, top_k, top_p, seed = sampling
    return sample(logits.reshape(b * k, v), positions.reshape(-1), temperature.repeat_interleave(k),
                  top_k.repeat_interleave(k), top_p.repeat_interleave(k), seed.repeat_interleave(k),
                  vocab_ids).view(b, k)


def confident_prefix(logits: torch.Tensor, columns: torch.Tensor, temperature: torch.Tensor, min_confidence: float,
                     running: torch.Tensor | None = None, log_trust=torch_log_trust) -> tuple[int, torch.Tensor]:
    """(K', running) for drafts `columns` [B, K] of `logits` [B, K, V] under the confidence cut: K' the slots
    some row still trusts (at least 1 for the first chunk), each slot's trust being the draft's probability of
    its token (softmax at the row's temperature; a greedy row's is its max probability), multiplied along the
    block from `running` [B] (log; 0 by default); `running` returned is each row's log product after the last
    slot."""
    t = torch.where(temperature > 0, temperature, torch.ones_like(temperature)).float()
    b, k, v = logits.shape
    log_q = log_trust(logits.reshape(b * k, v), columns.reshape(-1), t.repeat_interleave(k))
    product = log_q.view(b, k).nan_to_num(nan=float("-inf")).cumsum(dim=1)
    if running is not None:
        product = product + running[:, None]
    if min_confidence <= 0.0:
        return columns.shape[1], product[:, -1]
    kept = int((product >= math.log(min_confidence)).sum(dim=1).max())
    return max(1, kept) if running is None else kept, product[:, -1]


def propose(draft, hidden: torch.Tensor, lm_head, start: torch.Tensor, sampling=None,
            anchor: torch.Tensor | None = None, min_confidence: float = 0.0, ops: DraftOps = TORCH_OPS,
            sampled: bool | None = None) -> torch.Tensor:
    """Drafts [B, K' <= K] (token ids) for block slots 1..K from the drafter's final hidden rows [B, K, H]:
    greedy, coupled where a row samples (`sampling` = (T, top_k, top_p, seed) [B]; `start` [B] the bonus
    tokens' positions), through the drafter's draft vocabulary if it has one (`draft.vocab`: token ids and
    their head rows). `anchor` [B]: the bonus tokens (a DFlash2 drafter's walk starts there). `sampled`: whether
    some row samples, when the caller knows (else read from `sampling`)."""
    ids, head = (None, lm_head) if draft.vocab is None else draft.vocab
    sampled = sampled if sampled is not None else any_sampled(sampling)
    if draft.candidate_selector is not None:  # DFlash2: the selector's walk from the bonus token, all K slots
        if anchor is None:
            raise ValueError("a DFlash2 drafter proposes from the block's first token: pass anchor")
        return draft.candidate_selector.drafts(hidden, draft_logits(draft, hidden, head, ops), anchor, start,
                                               sampling if sampled else None, ids)
    if sampled:
        columns = _coupled(draft, hidden, head, start, sampling, min_confidence, ids, ops)
    else:
        columns = confident_drafts(lambda lo, hi: draft_logits(draft, hidden[:, lo:hi], head, ops), hidden.shape[1],
                                   min_confidence)
    return columns if ids is None else ids[columns]


def _coupled(draft, hidden, head, start, sampling, min_confidence: float, ids, ops: DraftOps) -> torch.Tensor:
    """Coupled drafts [B, K' <= K] (head columns) in chunks of slots (CONFIDENCE_FIRST, then the rest): with
    the confidence cut, the later slots' head and sampling are skipped once no row trusts them."""
    k, lo, chunks, running = hidden.shape[1], 0, [], None
    while lo < k:
        hi = k if (lo or min_confidence <= 0.0) else min(k, CONFIDENCE_FIRST)
        logits = draft_logits(draft, hidden[:, lo:hi], head, ops)
        columns = coupled_drafts(logits, start + lo, sampling, ids, ops.sample)
        if min_confidence <= 0.0:
            return columns
        kept, running = confident_prefix(logits, columns, sampling[0], min_confidence, running, ops.log_trust)
        chunks.append(columns[:, :kept])
        if kept < hi - lo:
            break
        lo = hi
    return torch.cat(chunks, dim=1)
