"""Building blocks shared by the target and the drafter: RMSNorm, RoPE, SwiGLU MLP, projections.

Numerics follow Hugging Face's Qwen3 / Llama modules (RMSNorm and RoPE in fp32, cast back), so
fp32 logits match `transformers` to ~1e-6.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from dflash_trt.checkpoint.configs import RopeConfig, TransformerDims


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], with linear or llama3 scaling applied."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.type == "linear":
        return inv_freq / rope.factor
    if rope.type == "llama3":
        old_len = rope.original_max_position_embeddings
        low_wavelen = old_len / rope.low_freq_factor
        high_wavelen = old_len / rope.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
        smooth = (old_len / wavelen - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    return inv_freq


class Rotary(nn.Module):
    """cos / sin tables for absolute positions, computed per call like HF (fp32 outer product)."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, head_dim] (broadcast over heads)."""
        freqs = positions.float()[..., None] * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., D] rotated by broadcastable cos / sin [..., D] (HF `rotate_half` convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class MLP(nn.Module):
    def __init__(self, dims: TransformerDims):
        super().__init__()
        h, i, bias = dims.hidden_size, dims.intermediate_size, dims.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class AttentionProjections(nn.Module):
    """q/k/v/o projections and optional per-head q/k RMSNorm (Qwen3) with HF parameter names."""

    def __init__(self, dims: TransformerDims):
        super().__init__()
        h, hd, bias = dims.hidden_size, dims.head_dim, dims.attention_bias
        self.num_heads, self.num_kv_heads, self.head_dim = dims.num_heads, dims.num_kv_heads, hd
        self.q_proj = nn.Linear(h, dims.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(h, dims.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(h, dims.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(dims.num_heads * hd, h, bias=bias)
        self.q_norm = RMSNorm(hd, dims.rms_norm_eps) if dims.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(hd, dims.rms_norm_eps) if dims.qk_norm else nn.Identity()

    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, H] -> q [B, heads, T, D], normed and rotated."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.num_heads, self.head_dim)).transpose(1, 2)
        return apply_rotary(q, cos, sin)

    def key_value(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> k, v [B, T, kv_heads, D]; k normed and rotated (cache layout)."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim))
        k = apply_rotary(k, cos.transpose(1, 2), sin.transpose(1, 2))
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim)
        return k, v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """q [B, heads, T, D]; k, v [B, kv_heads, S, D]; visible [B, 1, T, S] bool -> [B, T, H]."""
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=visible, scale=self.head_dim**-0.5,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        b, _, t, _ = q.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
