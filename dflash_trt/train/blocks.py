"""The DFlash training objective: random anchor blocks drafted against frozen target features.

For a sequence x with target features F (SpecForge `dflash_family_model.py`, paper §4):
- sample N anchors a (with loss_mask[a + 1] = 1), redrawn every step;
- block n is `[x_a, MASK x (B-1)]` at positions a .. a+B-1, embedded with the TARGET embedding;
- a block query sees context key k iff k < a (strictly before the anchor: at inference the
  anchor's own features are not available yet) and every key of its own block (non-causal;
  causal + window on sliding layers); all N blocks run in ONE forward against a
  [N*B, S + N*B] mask;
- loss: cross-entropy at slots 1..B-1 against x_{a+k}, weighted by exp(-(k-1)/gamma), masked.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from dflash_trt.model.draft import DFlashDraft
from dflash_trt.model.target import Target


@dataclass
class BlockBatch:
    anchors: torch.Tensor  # [Bt, N] anchor positions (-1 = unused block)
    block_tokens: torch.Tensor  # [Bt, N*B] [x_a, MASK...] per block
    block_positions: torch.Tensor  # [Bt, N*B]
    labels: torch.Tensor  # [Bt, N, B-1] x_{a+k}, -100 where masked
    weights: torch.Tensor  # [B-1] exp(-(k-1)/gamma)


def sample_blocks(
    tokens: torch.Tensor,  # [Bt, S]
    loss_mask: torch.Tensor,  # [Bt, S] bool: positions whose prediction is trained
    num_anchors: int,
    block_size: int,
    mask_token_id: int,
    gamma: float,
    generator: torch.Generator,
) -> BlockBatch:
    """Draw anchors a with loss_mask[a + 1] (and a >= 1 so some context exists); build blocks."""
    bt, s = tokens.shape
    eligible = torch.zeros_like(loss_mask)
    eligible[:, 1 : s - 1] = loss_mask[:, 2:]
    scores = torch.rand(bt, s, generator=generator).masked_fill(~eligible, -1.0)
    top = scores.topk(min(num_anchors, s), dim=1)
    anchors = torch.where(top.values >= 0, top.indices, torch.full_like(top.indices, -1))  # [Bt, N]
    return blocks_at(tokens, loss_mask, anchors, block_size, mask_token_id, gamma)


def blocks_at(tokens: torch.Tensor, loss_mask: torch.Tensor, anchors: torch.Tensor, block_size: int,
              mask_token_id: int, gamma: float) -> BlockBatch:
    """Blocks `[x_a, MASK...]` at anchors [Bt, N] (-1: unused) with labels x_{a+k} where trained."""
    bt, s = tokens.shape
    offsets = torch.arange(block_size)
    positions = anchors.clamp(min=0)[:, :, None] + offsets  # [Bt, N, B]
    block = torch.full(positions.shape, mask_token_id, dtype=torch.int64)
    block[:, :, 0] = tokens.gather(1, anchors.clamp(min=0))
    target_pos = positions[:, :, 1:].clamp(max=s - 1)
    labels = tokens.gather(1, target_pos.reshape(bt, -1)).view_as(target_pos)
    keep = (positions[:, :, 1:] < s) & (anchors[:, :, None] >= 0)
    keep &= loss_mask.gather(1, target_pos.reshape(bt, -1)).view_as(target_pos)
    labels = labels.masked_fill(~keep, -100)
    weights = torch.exp(-(offsets[1:].float() - 1) / gamma)
    return BlockBatch(anchors, block.view(bt, -1), positions.view(bt, -1), labels, weights)


def block_attention_mask(anchors: torch.Tensor, seq_len: int, block_size: int, causal: bool, window: int | None):
    """[Bt, 1, N*B, S + N*B] bool: context keys k < anchor, keys of the query's own block."""
    bt, n = anchors.shape
    q_block = torch.arange(n).repeat_interleave(block_size)  # [N*B]
    q_pos = anchors.clamp(min=0).repeat_interleave(block_size, dim=1) + torch.arange(block_size).repeat(n)
    ctx = torch.arange(seq_len)[None, None, :] < anchors.repeat_interleave(block_size, dim=1)[:, :, None]
    same = (q_block[:, None] == q_block[None, :])[None].expand(bt, -1, -1)
    keys = torch.cat([torch.arange(seq_len)[None].expand(bt, -1), q_pos], dim=1)  # [Bt, S+N*B]
    rel = q_pos[:, :, None] - keys[:, None, :]
    mask = torch.cat([ctx, same], dim=2)
    if causal:
        mask &= rel >= 0
    if window is not None:
        mask &= rel < window
        if not causal:
            mask &= -rel < window
    return mask[:, None]


def draft_training_logits(
    draft: DFlashDraft,
    target: Target,
    target_hidden: torch.Tensor,  # [Bt, S, n*H] frozen target features
    batch: BlockBatch,
) -> torch.Tensor:  # [Bt, N, B-1, V]
    """One forward over all blocks: context K/V from every position, queries from the blocks."""
    bt, s, _ = target_hidden.shape
    n = batch.anchors.shape[1]
    block_size = batch.block_tokens.shape[1] // n
    ctx = draft.hidden_norm(draft.fc(target_hidden))
    ctx_rope = draft.rotary(torch.arange(s)[None].expand(bt, -1), ctx.dtype)
    with torch.no_grad():
        x = target.embed(batch.block_tokens)
    x = x * draft.config.input_embedding_scale
    rope = draft.rotary(batch.block_positions, x.dtype)
    for layer in draft.layers:
        h = layer.input_layernorm(x)
        q = layer.self_attn.query(h, *rope)
        k_ctx, v_ctx = layer.self_attn.key_value(ctx, *ctx_rope)
        k_blk, v_blk = layer.self_attn.key_value(h, *rope)
        keys = torch.cat([k_ctx, k_blk], dim=1).transpose(1, 2)
        values = torch.cat([v_ctx, v_blk], dim=1).transpose(1, 2)
        mask = block_attention_mask(batch.anchors, s, block_size, layer.is_causal, layer.window)
        x = x + layer.self_attn.attend(q, keys, values, mask)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    hidden = draft.norm(x).view(bt, n, block_size, -1)[:, :, 1:]
    return draft.logits(hidden, target.lm_head)


def block_loss(logits: torch.Tensor, batch: BlockBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Decay-weighted CE over slots 1..B-1, and per-slot accuracy [B-1] for monitoring."""
    v = logits.shape[-1]
    ce = F.cross_entropy(logits.reshape(-1, v).float(), batch.labels.reshape(-1), reduction="none")
    ce = ce.view_as(batch.labels)
    valid = batch.labels != -100
    w = batch.weights[None, None, :] * valid
    loss = (ce * w).sum() / w.sum().clamp(min=1e-8)
    correct = (logits.argmax(-1) == batch.labels) & valid
    accuracy = correct.sum((0, 1)).float() / valid.sum((0, 1)).clamp(min=1)
    return loss, accuracy


def distill_loss(logits: torch.Tensor, target_logits: torch.Tensor, batch: BlockBatch,
                 temperature: float, slots: int | None = None) -> torch.Tensor:
    """Decay-weighted KL(p_T || q_T) over slots 1..B-1: the target's distribution at the training temperature
    (`target_logits` [Bt, N, B-1, V], its logits for the token at each slot) against the drafter's, times T²
    (Hinton et al.'s scaling, so the gradient's size does not shrink with T). Zero when the drafter's
    tempered distribution equals the target's; a drafter trained so drafts, coupled with the request's noise,
    match what the target samples (decoding/drafts.py). `slots`: only block slots 1..slots (None: all)."""
    log_q = F.log_softmax(logits.float() / temperature, dim=-1)
    log_p = F.log_softmax(target_logits.float() / temperature, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1) * temperature**2  # [Bt, N, B-1]
    w = batch.weights[None, None, :] * (batch.labels != -100)
    if slots is not None:
        w = w * (torch.arange(w.shape[-1], device=w.device) < slots)
    return (kl * w).sum() / w.sum().clamp(min=1e-8)


def target_block_logits(final_hidden: torch.Tensor, lm_head, batch: BlockBatch) -> torch.Tensor:
    """The target's logits for the token at every block slot 1..B-1 ([Bt, N, B-1, V]): its final-norm hidden
    state [Bt, S, H] at the position before the slot (slot k of anchor a: position a + k - 1), through lm_head."""
    bt, n, k = batch.labels.shape
    s = final_hidden.shape[1]
    positions = batch.block_positions.view(bt, n, k + 1)[:, :, :-1].clamp(max=s - 1)  # a .. a+B-2
    rows = final_hidden.gather(1, positions.reshape(bt, -1, 1).expand(-1, -1, final_hidden.shape[-1]))
    with torch.no_grad():
        return lm_head(rows).view(bt, n, k, -1)


def simulated_acceptance_length(accuracy: torch.Tensor) -> float:
    """τ estimate from per-slot accuracy, treating slots as independent: 1 + sum prod acc."""
    return 1.0 + float(torch.cumprod(accuracy, 0).sum()) if accuracy.numel() else 1.0


@torch.no_grad()
def chain_acceptance_length(draft: DFlashDraft, target: Target, features, tokens: torch.Tensor,
                            loss_mask: torch.Tensor, rows: list[int], block_size: int, new_tokens: int,
                            chunk: int = 32) -> tuple[float, int]:
    """τ of greedy DFlash decoding over the trained (target-generated) part of `rows`, simulated:
    the drafter's greedy block at EVERY position, then the decoding chain walked from the first
    generated token (each step commits the leading matches plus one, the next anchor is the token
    after them), `new_tokens` per row. On target-regenerated greedy data this is what decoding those
    prompts gives (up to rounding); the uniform-anchor average of per-slot accuracy overstates it,
    since easy stretches take few steps. As in decoding, a block never drafts past the tokens still to
    come: the last blocks narrow (a narrower block is another non-causal problem, with other drafts).
    -> (τ, steps)."""
    committed = steps = 0
    for r in rows:
        trained = loss_mask[r].nonzero()[:, 0]
        if trained.numel() < 2:
            continue
        first, end = int(trained[0]), int(trained[-1]) + 1  # the prefill's bonus sits at `first`
        hidden = features(torch.tensor([r]))
        budget = min(new_tokens, end - first) - 1  # tokens after the prefill's one
        lengths = []  # committed tokens of a step anchored at first + i
        full = max(first, first + budget - block_size + 1)  # anchors from here on have fewer tokens to come
        for a0 in range(first, min(full, end - 1), chunk):
            anchors = torch.arange(a0, min(a0 + chunk, full, end - 1))[None]
            lengths += _chain_lengths(draft, target, hidden, tokens[r : r + 1], loss_mask[r : r + 1], anchors, block_size)
        for a in range(full, min(first + budget, end - 1)):  # width = the tokens still to come (1: an AR step)
            width = first + budget - a
            lengths += [1] if width < 2 else _chain_lengths(draft, target, hidden, tokens[r : r + 1],
                                                             loss_mask[r : r + 1], torch.tensor([[a]]), width)
        done, i = 0, 0
        while done < budget and i < len(lengths):
            take = min(lengths[i], budget - done)
            done, i, steps = done + take, i + take, steps + 1
        committed += done
    return (committed / steps if steps else float("nan")), steps


def _chain_lengths(draft, target, hidden, tokens, loss_mask, anchors, width: int) -> list[int]:
    """Tokens a greedy step anchored at each of `anchors` [1, n] commits with blocks of `width`."""
    batch = blocks_at(tokens, loss_mask, anchors, width, draft.config.mask_token_id, 1.0)
    logits = draft_training_logits(draft, target, hidden, batch)
    hits = (logits.argmax(-1) == batch.labels)[0].to(torch.int64)  # -100 labels never hit
    return (hits.cumprod(dim=1).sum(dim=1) + 1).tolist()


def cosine_lr(step: int, total: int, peak: float, warmup: float = 0.04) -> float:
    warm = max(1, int(total * warmup))
    if step < warm:
        return peak * (step + 1) / warm
    progress = (step - warm) / max(1, total - warm)
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
