"""Read a TensorRT-LLM checkpoint back into Hugging Face names (dequantized), one rank at a time.

This is how the torch runner consumes the very artifact a GPU engine build consumes: the reader
checks config.json and every rank file's tensor names, shapes and dtypes (headers only) against
the layout the config implies, then `load_rank` inverts the name map (unfusing qkv), dequantizes
FP8 / NVFP4 weights to fp32 and returns the activation and KV scales simulation needs. Shapes are
one rank's: heads / tp, intermediate / tp, padded vocab / tp for lm_head.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from dflash_trt.checkpoint.configs import TransformerDims
from dflash_trt.checkpoint.quant.modes import handler_for_algo
from dflash_trt.checkpoint.trtllm_config import (
    TrtllmConfig,
    check_tp,
    local_dims,
    read_trtllm_config,
)
from dflash_trt.checkpoint.trtllm_layout import Spec, check_quantizable, expected_tensors
from dflash_trt.checkpoint.trtllm_names import (
    DRAFT_NAMES,
    LINEAR_INPUTS,
    QUANTIZED_LINEARS,
    TARGET_NAMES,
    hf_names_of,
    linear_of,
)
from dflash_trt.errors import CheckpointError

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                      "F8_E4M3": torch.float8_e4m3fn, "U8": torch.uint8}
Tensors = dict[str, torch.Tensor]


@dataclass
class TrtllmCheckpoint:
    folder: Path
    config: TrtllmConfig

    def rank_file(self, rank: int) -> Path:
        return self.folder / f"rank{rank}.safetensors"


@dataclass
class RankState:
    """One rank's weights under HF names (fp32, local shapes) plus the scales simulation needs."""

    state: Tensors
    activation_scales: dict[str, Tensors] = field(default_factory=dict)  # HF module -> handler tensors
    kv_scales: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> fp32 [1]


def _header(file: Path) -> Spec:
    try:
        with safe_open(str(file), framework="pt") as f:
            slices = {name: f.get_slice(name) for name in f.keys()}
            return {n: (tuple(s.get_shape()), SAFETENSORS_DTYPES.get(s.get_dtype())) for n, s in slices.items()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{file}: unreadable safetensors file ({exc})") from None


def _check_rank_file(file: Path, expected: Spec) -> None:
    found = _header(file)
    missing, unknown = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing:
        raise CheckpointError(f"{file}: missing tensors: {', '.join(missing[:5])}")
    if unknown:
        raise CheckpointError(f"{file}: unexpected tensors (not in this layout): {', '.join(unknown[:5])}")
    for name, (shape, dtype) in expected.items():
        if found[name] != (shape, dtype):
            got_shape, got_dtype = found[name]
            raise CheckpointError(
                f"{file}: tensor '{name}' is {list(got_shape)} {got_dtype}, expected {list(shape)} {dtype} "
                f"from config.json"
            )


def _check_config(cfg: TrtllmConfig, where: Path) -> None:
    """Quantization this reader understands, and a layout the TP size and quantization allow."""
    if handler_for_algo(cfg.quant.quant_algo) is None:
        raise CheckpointError(f"{where}: field 'quantization.quant_algo': '{cfg.quant.quant_algo}' is not "
                              "supported; expected null, FP8 or NVFP4")
    if cfg.quant.kv_cache_quant_algo not in (None, "FP8"):
        raise CheckpointError(f"{where}: field 'quantization.kv_cache_quant_algo': "
                              f"'{cfg.quant.kv_cache_quant_algo}' is not supported; expected null or FP8")
    check_tp(cfg.model.dims, cfg.tp_size, where)
    problem = check_quantizable(cfg)
    if problem:
        raise CheckpointError(f"{where}: field '{problem[0]}': {problem[1]}")


def read_trtllm(folder: str | Path) -> TrtllmCheckpoint:
    """Parse config.json and check every rank file against it (headers only; nothing loaded)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: checkpoint folder not found")
    cfg = read_trtllm_config(folder / "config.json")
    _check_config(cfg, folder / "config.json")
    ckpt = TrtllmCheckpoint(folder, cfg)
    expected = expected_tensors(cfg)
    for rank in range(cfg.tp_size):
        file = ckpt.rank_file(rank)
        if not file.is_file():
            raise CheckpointError(f"{file}: file not found (config.json mapping.tp_size is {cfg.tp_size})")
        _check_rank_file(file, expected)
    return ckpt


def _unfuse(trt_name: str, tensor: torch.Tensor, names: dict, dims: TransformerDims) -> Tensors:
    """A TRT-LLM tensor -> its HF tensors; fused qkv rows split as [q | k | v] of this rank."""
    hf = hf_names_of(names, trt_name)
    if len(hf) == 1:
        return {hf[0]: tensor}
    q, kv = dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
    return dict(zip(hf, tensor.split([q, kv, kv])))


def _split_groups(tensors: Tensors) -> tuple[dict[str, Tensors], Tensors, dict[int, torch.Tensor]]:
    """-> {quantized linear base: {suffix: tensor}}, plain tensors, {layer: kv scale}."""
    linears, plain, kv = {}, {}, {}
    for name, t in tensors.items():
        linear = linear_of(name)
        if name.endswith(".attention.kv_cache_scaling_factor"):
            kv[int(name.split(".")[2])] = t.float()
        elif linear and linear[0] in QUANTIZED_LINEARS and linear[1] != "bias":
            base = name[: -len(linear[1]) - 1]
            linears.setdefault(base, {})[linear[1]] = t
        else:
            plain[name] = t
    return linears, plain, kv


def load_rank(ckpt: TrtllmCheckpoint, rank: int) -> RankState:
    """Rank `rank`'s weights, dequantized to fp32 under HF names, with activation / KV scales."""
    cfg = ckpt.config
    names = DRAFT_NAMES if cfg.is_draft else TARGET_NAMES
    dims = local_dims(cfg.model.dims, cfg.tp_size)
    handler = handler_for_algo(cfg.quant.quant_algo)
    with safe_open(str(ckpt.rank_file(rank)), framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    linears, plain, kv = _split_groups(tensors)
    out = RankState(state={}, kv_scales=kv)
    for name, t in plain.items():
        out.state |= _unfuse(name, t.float(), names, dims)
    for base, group in linears.items():
        out.state |= _unfuse(f"{base}.weight", handler.dequantize(group), names, dims)
        scales = {k: v for k, v in group.items() if k == "activation_scaling_factor"}
        if scales:
            prefix = hf_names_of(names, f"{base}.weight")[0].rsplit(".", 3)[0]
            for module in LINEAR_INPUTS[linear_of(f"{base}.weight")[0]]:
                out.activation_scales[f"{prefix}.{module}"] = scales
    return out
