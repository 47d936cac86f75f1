"""Verification: the target's own tokens for a drafted block, and how many drafts they accept.

The target runs the block ``[bonus, d_1 .. d_K]`` at positions ``p .. p+K``; its logits at row i
choose the token t_i at absolute position ``p + i + 1`` by the sampling rule. The acceptance
count a is the number of leading i with ``d_{i+1} == t_i``; the step commits ``t_0 .. t_a``
(equal to ``d_1 .. d_a`` then the new bonus token ``t_a``), so every committed token is a
target choice and the output is the target's own decoding.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.sampling import canonical_logits, sample_tokens, some_row_samples


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
    sampled: bool | None = None,  # some row has T > 0, when the caller knows (else read from `temperature`)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Target tokens [B, K+1] (row i is the token at position start+i+1) and accepted a [B]."""
    b, width, vocab = logits.shape
    if not some_row_samples(temperature, sampled):
        # all greedy: the rule is a plain argmax (NaN counts as -inf)
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
