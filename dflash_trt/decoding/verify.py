"""Verification: the target's own tokens for a drafted block, and how many drafts they accept.

The target runs the block ``[bonus, d_1 .. d_K]`` at positions ``p .. p+K``; its logits at row i
choose the token t_i at absolute position ``p + i + 1`` by the sampling rule. The acceptance
count a is the number of leading i with ``d_{i+1} == t_i``; the step commits ``t_0 .. t_a``
(equal to ``d_1 .. d_a`` then the new bonus token ``t_a``), so every committed token is a
target choice and the output is the target's own decoding.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.sampling import canonical_logits, sample_tokens
from dflash_trt.model import cpu_ops
from dflash_trt.model.layers import head_logits


def accept_length(drafts: torch.Tensor, target_tokens: torch.Tensor) -> torch.Tensor:
    """a per row: leading matches of drafts [B, K] against target_tokens[:, :K].  -> [B]"""
    k = drafts.shape[1]
    matches = (drafts == target_tokens[:, :k]).to(torch.int64)
    return matches.cumprod(dim=1).sum(dim=1)


def verify_block(
    logits: torch.Tensor,  # [B, K+1, V] target logits over [bonus, d_1 .. d_K]
    drafts: torch.Tensor,  # [B, K] int64
    start: torch.Tensor,  # [B] int64: absolute position of the bonus token (block slot 0)
    temperature: torch.Tensor,  # [B] fp32
    top_k: torch.Tensor,  # [B] int64
    top_p: torch.Tensor,  # [B] fp32
    seed: torch.Tensor,  # [B] int64
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target tokens [B, K+1] (row i is the token at position start+i+1) and accepted a [B]."""
    b, width, vocab = logits.shape
    if not bool((temperature > 0).any()):  # all greedy: the rule is a plain argmax (NaN counts as -inf)
        tokens = canonical_logits(logits).argmax(dim=-1)
        return tokens, accept_length(drafts, tokens)
    positions = start[:, None] + 1 + torch.arange(width, device=logits.device)[None, :]
    flat = sample_tokens(
        logits.reshape(b * width, vocab),
        positions.reshape(-1),
        temperature.repeat_interleave(width),
        top_k.repeat_interleave(width),
        top_p.repeat_interleave(width),
        seed.repeat_interleave(width),
    )
    tokens = flat.view(b, width)
    return tokens, accept_length(drafts, tokens)


SAMPLED_FIRST = 2  # rows of a sampled row's first head chunk in the C++ verify (greedy: `first`)


def verify_lazily(
    hidden: torch.Tensor,  # [B, K+1, H] final-norm hidden states over [bonus, d_1 .. d_K]
    lm_head,  # [N, H] -> [N, V]
    drafts: torch.Tensor,  # [B, K]
    start: torch.Tensor,  # [B]
    *sampling: torch.Tensor,  # temperature, top_k, top_p, seed [B]
    verify=verify_block,
    first: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify_block` with the lm_head run only as far as some row's drafts still match (CPU).

    Rows go through lm_head + the sampling rule in growing chunks (4, 4, 8, ...); once every row
    has a mismatch, later rows are not computed. Each row's token is the sampling rule applied to
    that row's logits alone, so the tokens that matter — t_0 .. t_a of every row — are the ones
    `verify_block` returns. Entries after t_a are unspecified (-1 where never computed).
    One sequence on CPU runs the same in C++: greedy (`cpu_ops.greedy_verify`; the rule is argmax), sampled
    through the kernels' switch where it runs the twin (`cpu_ops.sampled_verify`, the twin's rule by pointer).
    """
    b, width, h = hidden.shape
    if cpu_ops.head_ready(hidden, lm_head):  # one row on CPU
        if float(sampling[0][0]) == 0.0:
            row_tokens, a = cpu_ops.greedy_verify(hidden[0], lm_head, drafts[0], first)
            return row_tokens[None], torch.tensor([a])
        from dflash_trt.kernels import verify as kernels  # the switch decoding loops pass as `verify`

        # sampled, through the kernels' switch where it runs the twin: rows 2 at a time (rarely accepted)
        if verify is kernels.verify_block and (rule := cpu_ops.twin_rule(sampling, hidden)) is not None:
            row_tokens, a = cpu_ops.sampled_verify(hidden[0], lm_head, drafts[0], SAMPLED_FIRST, rule, int(start[0]))
            return row_tokens[None], torch.tensor([a])
    tokens = torch.full((b, width), -1, dtype=torch.int64, device=hidden.device)
    matched = torch.ones(b, dtype=torch.bool, device=hidden.device)  # every draft so far accepted
    accepted = torch.zeros(b, dtype=torch.int64, device=hidden.device)
    lo, size = 0, first
    while lo < width:
        hi = min(width, lo + size)
        logits = head_logits(lm_head, hidden[:, lo:hi].reshape(-1, h)).view(b, hi - lo, -1)
        # the rule on rows lo..hi-1 (positions start+lo+1 ..); the drafts argument only sizes the call
        chunk, _ = verify(logits, drafts.new_zeros(b, hi - lo - 1), start + lo, *sampling)
        tokens[:, lo:hi] = chunk
        n = min(hi, drafts.shape[1]) - lo  # drafts d_{lo+1} .. d_{min(hi, K)} are judged by this chunk
        run = (drafts[:, lo : lo + n] == chunk[:, :n]).to(torch.int64).cumprod(dim=1)  # [B, n]
        accepted += run.sum(dim=1) * matched
        matched &= run[:, -1].bool() if n else matched
        if not bool(matched.any()):
            break
        lo, size = hi, 2 * size if lo else size
    return tokens, accepted
