"""One handler per quantization mode, dispatched from `HANDLERS` ("none", "fp8", "nvfp4").

A handler turns one linear layer (weight [out, in] plus calibrated amaxes) into the tensors a
TensorRT-LLM checkpoint stores under `<linear>.<suffix>`, and back:

| mode  | quant_algo | weight              | weights_scaling_factor | weights_scaling_factor_2 | activation_scaling_factor |
|-------|------------|---------------------|------------------------|--------------------------|---------------------------|
| none  | null       | dtype [out, in]     | -                      | -                        | -                         |
| fp8   | FP8        | e4m3 [out, in]      | fp32 [1]               | -                        | fp32 [1]                  |
| nvfp4 | NVFP4      | uint8 [out, in / 2] | e4m3 [out, in / 16]    | fp32 []                  | fp32 []                   |

(Scale shapes are Model Optimizer 0.47's: [1] for FP8, 0-d for NVFP4.) FP8 KV cache adds
`attention.kv_cache_scaling_factor` fp32 [1] per layer (`kv_cache_scale`).
"""

from __future__ import annotations

import torch

from dflash_trt.checkpoint.quant import numerics as nq
from dflash_trt.errors import ConfigError

Tensors = dict[str, torch.Tensor]
Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]  # suffix -> (shape, dtype)


class NoQuant:
    """Weights stored in the checkpoint dtype; nothing to calibrate."""

    name, quant_algo, group_size = "none", None, 128

    def check(self, out_features: int, in_features: int) -> str | None:
        return None

    def quantize(self, weight: torch.Tensor, weight_amax, input_amax, dtype: torch.dtype) -> Tensors:
        return {"weight": weight.to(dtype)}

    def dequantize(self, tensors: Tensors) -> torch.Tensor:
        return tensors["weight"].float()

    def spec(self, out_features: int, in_features: int, dtype: torch.dtype) -> Spec:
        return {"weight": ((out_features, in_features), dtype)}

    def fake_quant_input(self, x: torch.Tensor, tensors: Tensors) -> torch.Tensor:
        return x


class Fp8:
    """W8A8 FP8 e4m3, one scale per weight tensor and one per activation tensor."""

    name, quant_algo, group_size = "fp8", "FP8", 128

    def check(self, out_features: int, in_features: int) -> str | None:
        return None

    def quantize(self, weight: torch.Tensor, weight_amax, input_amax, dtype: torch.dtype) -> Tensors:
        w_scale = nq.fp8_scale(weight_amax).reshape(1)
        return {
            "weight": nq.fp8_quantize(weight, w_scale),
            "weights_scaling_factor": w_scale,
            "activation_scaling_factor": nq.fp8_scale(input_amax).reshape(1),
        }

    def dequantize(self, tensors: Tensors) -> torch.Tensor:
        return nq.fp8_dequantize(tensors["weight"], tensors["weights_scaling_factor"].float())

    def spec(self, out_features: int, in_features: int, dtype: torch.dtype) -> Spec:
        scale = ((1,), torch.float32)
        return {"weight": ((out_features, in_features), torch.float8_e4m3fn),
                "weights_scaling_factor": scale, "activation_scaling_factor": scale}

    def fake_quant_input(self, x: torch.Tensor, tensors: Tensors) -> torch.Tensor:
        return nq.fp8_fake_quant(x, tensors["activation_scaling_factor"].float() * nq.E4M3_MAX)


class Nvfp4:
    """W4A4 NVFP4: e2m1 weights in 16-wide blocks with e4m3 block scales and an fp32 global scale."""

    name, quant_algo, group_size = "nvfp4", "NVFP4", nq.NVFP4_BLOCK

    def check(self, out_features: int, in_features: int) -> str | None:
        if in_features % nq.NVFP4_BLOCK:
            return f"in_features={in_features} is not a multiple of the NVFP4 block ({nq.NVFP4_BLOCK})"
        return None

    def quantize(self, weight: torch.Tensor, weight_amax, input_amax, dtype: torch.dtype) -> Tensors:
        global_scale = nq.nvfp4_global_scale(weight_amax).reshape(())
        packed, block_scales = nq.nvfp4_quantize(weight, global_scale)
        return {
            "weight": packed,
            "weights_scaling_factor": block_scales,
            "weights_scaling_factor_2": global_scale,
            "activation_scaling_factor": nq.nvfp4_global_scale(input_amax).reshape(()),
        }

    def dequantize(self, tensors: Tensors) -> torch.Tensor:
        return nq.nvfp4_dequantize(
            tensors["weight"], tensors["weights_scaling_factor"], tensors["weights_scaling_factor_2"].float()
        )

    def spec(self, out_features: int, in_features: int, dtype: torch.dtype) -> Spec:
        scalar = ((), torch.float32)
        return {
            "weight": ((out_features, in_features // 2), torch.uint8),
            "weights_scaling_factor": ((out_features, in_features // nq.NVFP4_BLOCK), torch.float8_e4m3fn),
            "weights_scaling_factor_2": scalar,
            "activation_scaling_factor": scalar,
        }

    def fake_quant_input(self, x: torch.Tensor, tensors: Tensors) -> torch.Tensor:
        amax = tensors["activation_scaling_factor"].float() * (nq.E2M1_MAX * nq.E4M3_MAX)
        return nq.nvfp4_fake_quant(x, amax)


HANDLERS = {"none": NoQuant(), "fp8": Fp8(), "nvfp4": Nvfp4()}
KV_CACHE_MODES = {"none": None, "fp8": "FP8"}  # --kv-cache value -> kv_cache_quant_algo
KV_SCALE_SPEC = ((1,), torch.float32)


def get_handler(mode: str):
    """The handler for `mode`; an unknown mode lists the known ones."""
    if mode not in HANDLERS:
        raise ConfigError(f"unknown quantization mode {mode!r}; expected one of {sorted(HANDLERS)}")
    return HANDLERS[mode]


def handler_for_algo(quant_algo: str | None):
    """The handler that writes TRT-LLM `quant_algo` (None for unquantized), or None if unknown."""
    return next((h for h in HANDLERS.values() if h.quant_algo == quant_algo), None)


def kv_cache_scale(k_amax, v_amax) -> torch.Tensor:
    """FP8 KV scale fp32 [1]: max(k, v) of amax / 448, each clamped to >= 1 as Model Optimizer does."""
    one = torch.ones(1)
    k = torch.maximum(nq.fp8_scale(k_amax).reshape(1), one)
    v = torch.maximum(nq.fp8_scale(v_amax).reshape(1), one)
    return torch.maximum(k, v)
