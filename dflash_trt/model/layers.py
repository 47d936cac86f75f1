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
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)  # one op; the same bits as below in fp32
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """Inverse frequencies [head_dim / 2], with linear, llama3 or yarn scaling applied (transformers'
    modeling_rope_utils, the same float32 operations in the same order)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    if rope.type == "yarn":
        return _yarn_inv_freq(rope, head_dim, rope.theta**exponents)
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


def _yarn_inv_freq(rope: RopeConfig, dim: int, pos_freqs: torch.Tensor) -> torch.Tensor:
    """YaRN: interpolated (divided by `factor`) frequencies for the dimensions that rotate fewer than `beta_slow`
    times over the original window, extrapolated ones above `beta_fast`, a linear ramp between."""

    def correction_dim(rotations: float) -> float:
        window = rope.original_max_position_embeddings
        return dim * math.log(window / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolated = 1 - ramp
    return (1.0 / (rope.factor * pos_freqs)) * (1 - extrapolated) + (1.0 / pos_freqs) * extrapolated


class Rotary(nn.Module):
    """cos / sin for absolute positions: a table grown on demand, entries computed exactly as HF does
    per call (fp32 outer product position x inv_freq), so a lookup equals HF's values bit for bit."""

    def __init__(self, rope: RopeConfig, head_dim: int):
        super().__init__()
        self.register_buffer("inv_freq", rope_inv_freq(rope, head_dim), persistent=False)
        self.attention_scaling = rope.attention_scaling()  # yarn's factor on cos / sin (1.0 otherwise)
        self._tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def _table(self, length: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self._tables.get(dtype, (None, None))
        if cos is None or cos.shape[0] < length or cos.device != self.inv_freq.device:
            size = max(length, 2 * (cos.shape[0] if cos is not None else 256))
            positions = torch.arange(size, device=self.inv_freq.device).float()
            freqs = positions[:, None] * self.inv_freq.float()[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            cos, sin = (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)
            self._tables[dtype] = (cos, sin)
        return cos, sin

    def rows(self, start: int, n: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [n, head_dim] of positions start..start+n-1 (contiguous views of the table)."""
        cos, sin = self._table(start + n, dtype)
        return cos[start : start + n], sin[start : start + n]

    def at(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [N, head_dim] of flat positions [N] (gathered rows of the table)."""
        cos, sin = self._table(int(positions.max()) + 1, dtype)
        return cos[positions], sin[positions]

    def forward(self, positions: torch.Tensor, dtype: torch.dtype,
                end: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [B, T] -> cos, sin [B, 1, T, head_dim] (broadcast over heads); `end`: a bound on the positions
        the caller knows on the host (else read from them)."""
        cos, sin = self._table(end if end is not None else int(positions.max()) + 1, dtype)
        return cos[positions][:, None], sin[positions][:, None]


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

        self.gate_up: torch.Tensor | None = None  # [2I, H] fused weight (views back the HF params)

    def fuse(self) -> None:
        """One matmul for gate and up: concatenate the weights, make the HF params views of it."""
        if self.gate_proj.bias is not None or self.gate_up is not None:
            return
        self.gate_up = _fuse_linears(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up is not None:
            gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _fuse_linears(*linears: nn.Linear) -> torch.Tensor:
    """Concatenate weights [out_i, in] -> [sum out_i, in]; the Linears' weights become views of it."""
    fused = torch.cat([lin.weight.detach() for lin in linears], dim=0)
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight = nn.Parameter(fused[start : start + n], requires_grad=False)
        start += n
    return fused


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
        self.qkv: torch.Tensor | None = None  # [q + 2 kv, H] fused weight (views back the HF params)
        self.splits = (dims.num_heads * hd, dims.num_kv_heads * hd, dims.num_kv_heads * hd)

    def fuse(self) -> None:
        """One matmul for q, k, v (inference): the HF params become views of one fused weight."""
        if self.q_proj.bias is not None or self.qkv is not None:
            return
        self.qkv = _fuse_linears(self.q_proj, self.k_proj, self.v_proj)

    def _shape_q(self, q: torch.Tensor, cos, sin) -> torch.Tensor:
        b, t, _ = q.shape
        q = self.q_norm(q.view(b, t, self.num_heads, self.head_dim)).transpose(1, 2)
        return apply_rotary(q, cos, sin)

    def _shape_kv(self, k: torch.Tensor, v: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        b, t, _ = k.shape
        k = self.k_norm(k.view(b, t, self.num_kv_heads, self.head_dim))
        k = apply_rotary(k, cos.transpose(1, 2), sin.transpose(1, 2))
        return k, v.view(b, t, self.num_kv_heads, self.head_dim)

    def query_key_value(self, x: torch.Tensor, cos, sin, q_from: int = 0):
        """x [B, T, H] -> q [B, heads, T - q_from, D] (rows q_from..); k, v [B, T, kv_heads, D] (normed, rotated)."""
        if self.qkv is not None:
            q, k, v = F.linear(x, self.qkv).split(self.splits, dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        if q_from:
            q, q_cos, q_sin = q[:, q_from:], cos[:, :, q_from:], sin[:, :, q_from:]
        else:
            q_cos, q_sin = cos, sin
        return (self._shape_q(q, q_cos, q_sin), *self._shape_kv(k, v, cos, sin))

    def query(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, T, H] -> q [B, heads, T, D], normed and rotated."""
        return self._shape_q(self.q_proj(x), cos, sin)

    def key_value(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, T, H] -> k, v [B, T, kv_heads, D]; k normed and rotated (cache layout)."""
        if self.qkv is not None:
            k, v = F.linear(x, self.qkv[self.splits[0] :]).split(self.splits[1:], dim=-1)
        else:
            k, v = self.k_proj(x), self.v_proj(x)
        return self._shape_kv(k, v, cos, sin)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """q [B, heads, T, D]; k, v [B, kv_heads, S, D]; visible [B, 1, T, S] bool -> [B, T, H]."""
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=visible, scale=self.head_dim**-0.5,
            enable_gqa=self.num_heads != self.num_kv_heads,
        )
        b, _, t, _ = q.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
