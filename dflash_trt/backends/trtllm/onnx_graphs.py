"""The DFlash drafter as two stateless, export-friendly torch graphs (the draft engine's source).

`DFlashDraft` keeps its context cache inside a `KVCache` and sizes tensors with Python ints, which
tracing would freeze. These wrappers reuse its modules (same weights, same projections, norms,
RoPE and MLP code) but take the cache as tensors, so one graph serves every batch and length:

- `DraftContextGraph(target_hidden [N, n*H], positions [N]) -> context_k, context_v [L, N, kvh, D]`:
  `fc` -> `hidden_norm` -> per layer k_norm(k_proj) with RoPE at the absolute position, v_proj
  (what `DFlashDraft.append_context` writes into the cache).
- `DraftProposeGraph(block_ids [B, Q], start [B], context_k, context_v [L, B, kvh, S, D],
  context_lengths [B]) -> drafts [B, Q-1]`: the noise block [bonus, MASK x (Q-1)] (Q <= the
  exported block_size; the scheduler may narrow it per step) embedded with the TARGET's
  embed_tokens at positions start..start+Q-1, attention over [context ; block] (context
  masked by its length, non-causal inside the block; causal + window on sliding layers), draft
  `norm`, TARGET `lm_head` (multiplier, softcap), argmax (what `DFlashDraft.forward` +
  `TorchDraftRunner.propose` compute).

RoPE comes from a constant cos/sin table built by the runtime's own `Rotary`, so positions map to
the torch values bit for bit; attention is written out because `scaled_dot_product_attention`
with grouped KV heads has no ONNX export.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.model.draft import DFlashDraft
from dflash_trt.model.draft_layer import DraftLayer
from dflash_trt.model.layers import AttentionProjections, Rotary
from dflash_trt.model.target import Target


class RopeTable(nn.Module):
    """cos / sin rows for positions 0..capacity-1, exactly the torch runtime's table values."""

    def __init__(self, rotary: Rotary, capacity: int, dtype: torch.dtype):
        super().__init__()
        cos, sin = rotary._table(capacity, dtype)
        self.register_buffer("cos", cos[:capacity].clone(), persistent=False)  # [capacity, D]
        self.register_buffer("sin", sin[:capacity].clone(), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, D] (the layout `Rotary.forward` returns)."""
        return self.cos[positions][:, None], self.sin[positions][:, None]


def attend(attn: AttentionProjections, q, k, v, visible) -> torch.Tensor:
    """q [B, heads, Q, D]; k, v [B, kvh, S, D]; visible [B, 1, Q, S] bool -> o_proj output [B, Q, H]."""
    b, heads, t, d = q.shape
    group = attn.num_heads // attn.num_kv_heads
    if group > 1:  # query head h reads kv head h // group (SDPA's enable_gqa)
        k = k[:, :, None].expand(-1, -1, group, -1, -1).reshape(b, heads, -1, d)
        v = v[:, :, None].expand(-1, -1, group, -1, -1).reshape(b, heads, -1, d)
    scores = torch.matmul(q, k.transpose(-1, -2)) * attn.head_dim**-0.5  # [B, heads, Q, S]
    scores = scores.float().masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = torch.matmul(probs, v)  # [B, heads, Q, D]
    return attn.o_proj(out.transpose(1, 2).reshape(b, t, heads * d))


def block_mask(layer: DraftLayer, positions, context_lengths, context_len_like) -> torch.Tensor:
    """[B, 1, Q, S + Q] visibility over [context ; block] in absolute positions (`DraftLayer.narrow`)."""
    ctx_pos = torch.arange(context_len_like.shape[3], device=positions.device)  # [S]
    ctx_ok = (ctx_pos[None, None, :] < context_lengths[:, None, None]).expand(-1, positions.shape[1], -1)
    keys = torch.cat([ctx_pos[None, :].expand(positions.shape[0], -1), positions], dim=1)  # [B, S + Q]
    rel = positions[:, :, None] - keys[:, None, :]  # [B, Q, S + Q]: query minus key position
    block_ok = torch.ones_like(positions[:, :, None].expand(-1, -1, positions.shape[1]), dtype=torch.bool)
    return layer.narrow(torch.cat([ctx_ok, block_ok], dim=2), rel)[:, None]


class DraftContextGraph(nn.Module):
    def __init__(self, draft: DFlashDraft, capacity: int):
        super().__init__()
        self.draft = draft
        self.rope = RopeTable(draft.rotary, capacity, draft.fc.weight.dtype)

    def forward(self, target_hidden: torch.Tensor, positions: torch.Tensor):
        """target_hidden [N, n*H], positions [N] -> context_k, context_v [L, N, kvh, D]."""
        d = self.draft
        ctx = d.hidden_norm(d.fc(target_hidden))[None]  # [1, N, H]
        cos, sin = self.rope(positions[None])
        keys, values = [], []
        for layer in d.layers:
            k, v = layer.self_attn.key_value(ctx, cos, sin)  # [1, N, kvh, D]
            keys.append(k[0])
            values.append(v[0])
        return torch.stack(keys), torch.stack(values)


class DraftProposeGraph(nn.Module):
    def __init__(self, draft: DFlashDraft, target: Target, capacity: int, sampled: bool = False):
        super().__init__()
        self.draft, self.embed_tokens, self.lm_head = draft, target.model.embed_tokens, target.lm_head
        self.rope = RopeTable(draft.rotary, capacity, draft.fc.weight.dtype)
        self.vocab = draft.vocab  # (token ids, head rows) of a draft vocabulary (DFlashDraft.use_vocab), or None
        self.sampled = sampled  # also return the draft logits (float32), for coupled drafts of sampled rows

    def forward(self, block_ids, start, context_k, context_v, context_lengths):
        """block_ids [B, Q]; start, context_lengths [B]; context_k/v [L, B, kvh, S, D] -> drafts [B, Q-1] int64
        (greedy), and with `sampled` the logits they are the argmax of, [B, Q-1, V'] float32 (V' the draft
        vocabulary's columns, in its order, when there is one)."""
        d = self.draft
        positions = start[:, None] + torch.arange(block_ids.shape[1], device=start.device)[None, :]  # [B, Q]
        x = self.embed_tokens(block_ids).to(d.fc.weight.dtype) * d.config.input_embedding_scale
        cos, sin = self.rope(positions)
        masks = {}
        for i, layer in enumerate(d.layers):
            kind = (layer.is_causal, layer.window)
            if kind not in masks:
                masks[kind] = block_mask(layer, positions, context_lengths, context_k)
            h = layer.input_layernorm(x)
            q, k_blk, v_blk = layer.self_attn.query_key_value(h, cos, sin)
            keys = torch.cat([context_k[i], k_blk.transpose(1, 2)], dim=2)  # [B, kvh, S + Q, D]
            values = torch.cat([context_v[i], v_blk.transpose(1, 2)], dim=2)
            x = x + attend(layer.self_attn, q, keys, values, masks[kind])
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        hidden = d.norm(x)
        head = self.lm_head if self.vocab is None else self.vocab[1]  # a draft vocabulary: only its rows scored
        logits = d.logits(hidden[:, 1:], head)  # [B, K, V']
        drafts = logits.argmax(dim=-1) if self.vocab is None else self.vocab[0][logits.argmax(dim=-1)]  # token ids
        return (drafts, logits.float()) if self.sampled else drafts
