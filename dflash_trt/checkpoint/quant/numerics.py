"""FP8 (e4m3) and NVFP4 (e2m1) numerics in pure torch: the recipes TensorRT-LLM kernels consume.

FP8, per tensor (W8A8 weights and activations, FP8 KV cache):
    scale = amax / 448                        fp32 *dequantization* scale (TRT-LLM `*_scaling_factor`)
    q     = e4m3(clamp(x / scale, +-448))     round to nearest even
    x'    = q * scale

NVFP4, blocks of 16 along the last (input) dimension:
    s2    = amax / (6 * 448)                  fp32 global scale (`weights_scaling_factor_2`)
    sb    = e4m3(clamp(block_amax / (6 * s2), 2^-9, 448));   an all-zero block gets sb = 1
    q     = e2m1(x / (sb * s2))               nearest of {0, .5, 1, 1.5, 2, 3, 4, 6} (+ sign),
                                              ties to the even code, saturating at 6
    byte  = q[2i] | q[2i+1] << 4              the EVEN element sits in the LOW nibble
    x'    = e2m1_value(q) * sb * s2
Activations use the same formulas with `amax` from calibration; NVFP4 activations are quantized
per block at run time, so only their global scale is stored.

Bit-identical to NVIDIA Model Optimizer 0.47 (`FP8QTensor`, `NVFP4QTensor`, its eager FP8 fake
quantizer) on the same tensors; tests/test_quant_numerics.py checks it byte for byte.
"""

from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16
# e2m1 code -> value: bit 3 is the sign, bits 0..2 index the magnitudes.
E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
# Midpoints between neighbouring e2m1 magnitudes (the rounding decision points).
E2M1_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_TINY = torch.finfo(torch.float32).tiny


def tensor_amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as a 0-d fp32 tensor."""
    return x.detach().abs().amax().float()


def _safe(amax: torch.Tensor) -> torch.Tensor:
    """An all-zero tensor still needs a positive scale (Model Optimizer clamps to `tiny` too)."""
    return torch.as_tensor(amax, dtype=torch.float32).clamp(min=_TINY)


# --- FP8 e4m3 ----------------------------------------------------------------------------------
def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """Per-tensor dequantization scale amax / 448 (fp32, same shape as `amax`)."""
    return _safe(amax) / E4M3_MAX


def fp8_quantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x [...] -> float8_e4m3fn [...] with x ~= q * scale."""
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def fp8_dequantize(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale


def fp8_round_trip(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """x rounded through e4m3 with a dequantization scale (FP8 KV cache), same dtype as x."""
    return fp8_dequantize(fp8_quantize(x, scale), scale).to(x.dtype)


def fp8_fake_quant(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Activation fake quantization exactly as Model Optimizer's eager path: x * (448/amax) ..."""
    amax = torch.as_tensor(amax, dtype=torch.float32)
    amax = torch.where(amax <= 2.0**-24, torch.ones_like(amax), amax)
    scale = E4M3_MAX / amax
    q = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return (q.float() * (1 / scale)).to(x.dtype)


# --- NVFP4: e2m1 values with e4m3 block scales ---------------------------------------------------
def nvfp4_global_scale(amax: torch.Tensor) -> torch.Tensor:
    """Global fp32 scale amax / (6 * 448), so block scales use the whole e4m3 range."""
    return _safe(amax) / (E2M1_MAX * E4M3_MAX)


def nvfp4_block_scales(x: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """x [..., n] -> e4m3 block scales [..., n / 16] (relative to `global_scale`)."""
    block_amax = x.float().unflatten(-1, (-1, NVFP4_BLOCK)).abs().amax(-1)
    scale = block_amax / (E2M1_MAX * global_scale)
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return scale.clamp(min=2.0**-9, max=E4M3_MAX).to(torch.float8_e4m3fn)


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """Round already-scaled values to 4-bit e2m1 codes (uint8 in 0..15), ties to even."""
    magnitude = y.abs()
    midpoints = E2M1_MIDPOINTS.to(y.device)
    code = torch.bucketize(magnitude, midpoints)  # a value on a midpoint gets the lower code
    on_midpoint = magnitude == midpoints[code.clamp(max=len(midpoints) - 1)]
    code = code + (on_midpoint & (code % 2 == 1))  # ... and moves up when that code is odd
    return (code | (y < 0).long() << 3).to(torch.uint8)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """codes [..., n] uint8 -> bytes [..., n / 2]: even element low nibble, odd element high."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """bytes [..., n / 2] -> codes [..., n]."""
    return torch.stack([packed & 0x0F, packed >> 4], dim=-1).flatten(-2)


def nvfp4_quantize(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., n] (n % 16 == 0) -> packed uint8 [..., n / 2], e4m3 block scales [..., n / 16]."""
    block_scales = nvfp4_block_scales(x, global_scale)
    blocks = x.float().unflatten(-1, (-1, NVFP4_BLOCK))
    scaled = blocks / (block_scales.float() * global_scale).unsqueeze(-1)
    return pack_e2m1(e2m1_codes(scaled.flatten(-2))), block_scales


def nvfp4_dequantize(packed: torch.Tensor, block_scales: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """Inverse of `nvfp4_quantize` -> fp32 [..., n]."""
    values = E2M1_VALUES.to(packed.device)[unpack_e2m1(packed).long()]
    blocks = values.unflatten(-1, (-1, NVFP4_BLOCK)) * (block_scales.float() * global_scale).unsqueeze(-1)
    return blocks.flatten(-2)


def nvfp4_fake_quant(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Activation fake quantization: dynamic 16-wide blocks under a calibrated global scale."""
    global_scale = nvfp4_global_scale(amax)
    packed, block_scales = nvfp4_quantize(x, global_scale)
    return nvfp4_dequantize(packed, block_scales, global_scale).to(x.dtype)
