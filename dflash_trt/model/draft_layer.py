"""One DFlash draft layer: attention over [context ; block] with its causal / sliding-window rule, then the
MLP; DFlash2 layers wrap both sublayers in grouped dynamic causal convolutions (model/dflash2.py)."""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.checkpoint.configs import DraftConfig
from dflash_trt.decoding.batch import Rows
from dflash_trt.model.dflash2 import GroupedDynamicConv
from dflash_trt.model.kv_cache import KVCache
from dflash_trt.model.layers import MLP, AttentionProjections, RMSNorm


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
        if config.is_dflash2:  # convolutions around both sublayers (model/dflash2.py)
            self.attention_conv = GroupedDynamicConv(d.hidden_size, config.conv_kernel_size, config.conv_group_size)
            self.mlp_conv = GroupedDynamicConv(d.hidden_size, config.conv_kernel_size, config.conv_group_size)
        else:
            self.attention_conv = self.mlp_conv = None

    def visible(self, q_pos: torch.Tensor, key_end: torch.Tensor, s: int, uniform: bool) -> torch.Tensor | None:
        """Mask [B, 1, Q or 1, s] over cache positions 0..s-1, or None when every key is visible.

        A row sees its context and its block, i.e. positions < key_end (later positions hold another
        row's longer context or stale drafts), narrowed by this layer's causal / sliding-window rule.
        """
        if uniform and not self.is_causal and self.window is None:
            return None
        keys = torch.arange(s, device=q_pos.device)
        ok = keys[None, None, :] < key_end[:, None, None]  # [B, 1, S]
        if self.is_causal or self.window is not None:
            ok = self.narrow(ok, q_pos[:, :, None] - keys[None, None, :])
        return ok[:, None]

    def narrow(self, ok: torch.Tensor, rel: torch.Tensor) -> torch.Tensor:
        """`ok` [B, Q or 1, S] and this layer's causal / sliding-window rule on `rel` [B, Q, S] (query
        minus key position; z-lab `_attention_mask`)."""
        if self.is_causal:
            ok = ok & (rel >= 0)
        if self.window is not None:
            ok = ok & (rel < self.window)
            if not self.is_causal:
                ok = ok & (-rel < self.window)
        return ok

    def forward(self, x, context, rope, cache: KVCache, layer: int, slots, positions, valid, s: int, visible,
                rows: Rows | None = None):
        """x [B, Q, H] block rows; context [B, C, H] features of newly committed tokens (or None).

        One projection for [context ; block]: the context rows' K/V (no input norm, as z-lab) and the
        block's K/V go into the cache at their positions, the block's queries attend to cache 0..s-1.
        """
        h = self.input_layernorm(x)
        after = None
        if self.attention_conv is not None:  # DFlash2: the block rows only, never the context
            h, after = self.attention_conv.prepare(h)
        n_ctx = 0
        if context is not None:
            n_ctx = context.shape[1]
            h = torch.cat([context, h], dim=1)
        q, k, v = self.self_attn.query_key_value(h, *rope, q_from=n_ctx)
        cache.write(layer, slots, positions, k, v, valid, rows and rows.end)
        keys, values = cache.read(layer, slots, s, rows)
        attended = self.self_attn.attend(q, keys, values, visible)
        x = x + (attended if after is None else self.attention_conv.finish(attended, after))
        h = self.post_attention_layernorm(x)
        if self.mlp_conv is None:
            return x + self.mlp(h)
        h, after = self.mlp_conv.prepare(h)
        return x + self.mlp_conv.finish(self.mlp(h), after)
