"""The DFlash drafter: a Qwen3-style block-diffusion model conditioned on target features.

Per call (paper §3, z-lab `DFlashDraftModel`):
1. `append_context`: committed tokens' `target_hidden` [B, T, n*H] -> `fc` -> `hidden_norm` =
   context features; every draft layer stores K = k_norm(k_proj(ctx)) with RoPE at the token's
   absolute position and V = v_proj(ctx) in the draft context cache. Only committed positions
   are ever stored; noise-block K/V are transient.
2. `propose`: the noise block `[bonus, MASK x K]` (embedded with the TARGET's embed_tokens) at
   positions start..start+K attends to [context cache ; block] — non-causal inside the block on
   full-attention layers, causal + window on sliding layers — and slots 1..K go through the draft
   `norm` and the TARGET `lm_head`; the proposal is the argmax at each slot.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.checkpoint.configs import DraftConfig
from dflash_trt.model.kv_cache import KVCache
from dflash_trt.model.layers import MLP, AttentionProjections, RMSNorm, Rotary


class DraftLayer(nn.Module):
    def __init__(self, config: DraftConfig, index: int):
        super().__init__()
        d = config.dims
        self.input_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.self_attn = AttentionProjections(d)
        self.post_attention_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.mlp = MLP(d)
        self.is_causal = config.layer_is_causal(index)
        self.window = config.layer_window(index)

    def visible(self, q_pos, ctx_pos, ctx_len, block_pos):
        """[B, 1, Q, S_ctx + Q] mask over [context ; block] in absolute positions."""
        ctx = ctx_pos[None, None, :] < ctx_len[:, None, None]  # [B, 1, S_ctx]
        ctx = ctx.expand(-1, q_pos.shape[1], -1)
        keys = torch.cat([ctx_pos[None, :].expand(q_pos.shape[0], -1), block_pos], dim=1)
        rel = q_pos[:, :, None] - keys[:, None, :]  # [B, Q, S] query minus key position
        ok = torch.cat([ctx, torch.ones_like(rel[:, :, ctx_pos.numel():], dtype=torch.bool)], dim=2)
        if self.is_causal:
            ok &= rel >= 0
        if self.window is not None:
            ok &= rel < self.window
            if not self.is_causal:
                ok &= -rel < self.window
        return ok[:, None]

    def forward(self, x, rope, cache: KVCache, layer: int, slots, s_ctx: int, visible):
        h = self.input_layernorm(x)
        q, k_blk, v_blk = self.self_attn.query_key_value(h, *rope)
        k_ctx, v_ctx = cache.read(layer, slots, s_ctx)
        keys = torch.cat([k_ctx, k_blk.transpose(1, 2)], dim=2)
        values = torch.cat([v_ctx, v_blk.transpose(1, 2)], dim=2)
        x = x + self.self_attn.attend(q, keys, values, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDraft(nn.Module):
    def __init__(self, config: DraftConfig):
        super().__init__()
        d = config.dims
        self.config = config
        self.layers = nn.ModuleList(DraftLayer(config, i) for i in range(d.num_layers))
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.fc = nn.Linear(len(config.target_layer_ids) * d.hidden_size, d.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.rotary = Rotary(d.rope, d.head_dim)

    def fuse(self) -> "DFlashDraft":
        """Fuse q/k/v and gate/up matmuls for inference (parameters keep their HF names)."""
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    def new_cache(self, n_slots: int, capacity: int) -> KVCache:
        d = self.config.dims
        w = self.fc.weight
        return KVCache(d.num_layers, n_slots, capacity, d.num_kv_heads, d.head_dim, w.dtype, w.device)

    def append_context(
        self,
        target_hidden: torch.Tensor,  # [B, T, n*H]
        positions: torch.Tensor,  # [B, T] absolute positions of those tokens
        cache: KVCache,
        slots: torch.Tensor,  # [B]
        valid: torch.Tensor | None = None,  # [B, T] bool: ragged rows (pad entries skipped)
    ) -> None:
        """Store the context K/V of committed tokens; the caller advances `cache.lengths`."""
        ctx = self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))
        cos, sin = self.rotary(positions, ctx.dtype)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.key_value(ctx, cos, sin)
            cache.write(i, slots, positions, k, v, valid)

    def forward(
        self,
        noise_embedding: torch.Tensor,  # [B, Q, H] target embeddings of [bonus, MASK x K]
        block_positions: torch.Tensor,  # [B, Q]
        cache: KVCache,
        slots: torch.Tensor,  # [B]
    ) -> torch.Tensor:  # [B, Q, H] after the draft norm
        ctx_len = cache.get_pos(slots)
        s_ctx = int(ctx_len.max())
        ctx_pos = torch.arange(s_ctx, device=ctx_len.device)
        x = noise_embedding.to(self.fc.weight.dtype) * self.config.input_embedding_scale
        rope = self.rotary(block_positions, x.dtype)
        masks = {}  # one mask per distinct (causal, window) layer kind
        for i, layer in enumerate(self.layers):
            kind = (layer.is_causal, layer.window)
            if kind not in masks:
                masks[kind] = layer.visible(block_positions, ctx_pos, ctx_len, block_positions)
            x = layer(x, rope, cache, i, slots, s_ctx, masks[kind])
        return self.norm(x)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Draft logits through the TARGET lm_head, with z-lab's multiplier and softcap."""
        # a sliced [B, K, H] view would make F.linear fall back to a batched matmul (~5x slower on CPU)
        flat = hidden.to(lm_head.weight.dtype).reshape(-1, hidden.shape[-1])
        logits = lm_head(flat).view(*hidden.shape[:-1], -1) * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits
