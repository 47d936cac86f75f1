"""Write one TensorRT-LLM checkpoint (config.json + rank{r}.safetensors) from a Hugging Face model.

Per output tensor, in one loop: gather its HF parts (renamed by the name map, fused in `FUSIONS`
order, dropped when mapped to None), quantize it if it is a quantized linear, split it into TP
shards. FP8 KV-cache scales are added per layer. Every rank's tensors are then checked against
`expected_tensors` before anything is written, so a bug can never produce a silently wrong file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from dflash_trt.checkpoint.quant.modes import handler_for_algo, kv_cache_scale
from dflash_trt.checkpoint.trtllm_config import TrtllmConfig
from dflash_trt.checkpoint.trtllm_layout import DTYPES, expected_tensors, split_tensor
from dflash_trt.checkpoint.trtllm_names import (
    DRAFT_NAMES,
    LINEAR_INPUTS,
    QUANTIZED_LINEARS,
    SHARED_WEIGHT_AMAX,
    TARGET_NAMES,
    group_names,
    linear_of,
)
from dflash_trt.checkpoint.weights import WeightFiles

Tensors = dict[str, torch.Tensor]


@dataclass
class ModelAmax:
    """Calibrated amaxes of one model, keyed by HF module name ('model.layers.0.self_attn.q_proj')."""

    weights: dict[str, float] = field(default_factory=dict)  # max |W|
    inputs: dict[str, float] = field(default_factory=dict)  # max |x| over calibration inputs
    kv: dict[int, tuple[float, float]] = field(default_factory=dict)  # layer -> (max |K|, max |V|)

    def to_dict(self) -> dict:
        return {"weights": self.weights, "inputs": self.inputs, "kv": {str(k): list(v) for k, v in self.kv.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "ModelAmax":
        kv = {int(k): (float(v[0]), float(v[1])) for k, v in data.get("kv", {}).items()}
        return cls(dict(data.get("weights", {})), dict(data.get("inputs", {})), kv)


def _hf_layer_prefix(cfg: TrtllmConfig, layer: str) -> str:
    return f"layers.{layer}." if cfg.is_draft else f"model.layers.{layer}."


def _amaxes(cfg: TrtllmConfig, amax: ModelAmax, trt_name: str, linear: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight amax, input amax) of a TRT-LLM linear: max over its HF parts and shared partners."""
    layer = trt_name.split(".")[2]
    prefix = _hf_layer_prefix(cfg, layer)
    partners = next((g for g in SHARED_WEIGHT_AMAX if linear in g), (linear,))
    weight_modules = [prefix + m for p in partners for m in LINEAR_INPUTS[p]]
    input_modules = [prefix + m for m in LINEAR_INPUTS[linear]]
    w = max(amax.weights[m] for m in weight_modules)
    x = max(amax.inputs[m] for m in input_modules)
    return torch.tensor(w, dtype=torch.float32), torch.tensor(x, dtype=torch.float32)


def _encode(cfg: TrtllmConfig, trt_name: str, tensor: torch.Tensor, amax: ModelAmax | None) -> Tensors:
    """One full fp32 tensor -> the tensors stored for it (quantized linears grow scale tensors)."""
    linear = linear_of(trt_name)
    dtype = DTYPES[cfg.dtype]
    if linear is None or linear[0] not in QUANTIZED_LINEARS or linear[1] != "weight" or not cfg.quant.quant_algo:
        return {trt_name: tensor.to(dtype)}
    handler = handler_for_algo(cfg.quant.quant_algo)
    base = trt_name[: -len(".weight")]
    w_amax, x_amax = _amaxes(cfg, amax, trt_name, linear[0])
    return {f"{base}.{suffix}": t for suffix, t in handler.quantize(tensor, w_amax, x_amax, dtype).items()}


def _kv_scales(cfg: TrtllmConfig, amax: ModelAmax) -> Tensors:
    return {f"transformer.layers.{layer}.attention.kv_cache_scaling_factor": kv_cache_scale(*amax.kv[layer])
            for layer in range(cfg.model.dims.num_layers)}


def _check(cfg: TrtllmConfig, tensors: Tensors, where: str) -> None:
    spec = expected_tensors(cfg)
    wrong = sorted(set(spec) ^ set(tensors))
    wrong += [n for n, t in tensors.items() if n in spec and (tuple(t.shape), t.dtype) != spec[n]]
    if wrong:
        raise AssertionError(f"{where}: converter produced an unexpected layout for {wrong[:5]}")


def convert_tensors(cfg: TrtllmConfig, weights: WeightFiles, amax: ModelAmax | None) -> list[Tensors]:
    """HF weights (+ calibration) -> one {TRT-LLM name: tensor} dict per TP rank."""
    names = DRAFT_NAMES if cfg.is_draft else TARGET_NAMES
    tied = not cfg.is_draft and cfg.model.tie_word_embeddings
    aliases = {"lm_head.weight": "model.embed_tokens.weight"} if tied else {}  # tied: lm_head IS the embedding
    hf_names = set(weights.names()) | set(aliases)
    dims, tp, vocab = cfg.model.dims, cfg.tp_size, cfg.model.vocab_size
    ranks: list[Tensors] = [{} for _ in range(tp)]
    for trt_name, parts in group_names(names, hf_names, weights.folder).items():
        sources = [aliases.get(p, p) for p in parts]
        loaded = weights.load(sources, torch.float32)
        full = torch.cat([loaded[s] for s in sources])  # fusion: concatenate along dim 0
        for name, tensor in _encode(cfg, trt_name, full, amax).items():
            for rank, shard in enumerate(split_tensor(name, tensor, dims, tp, vocab)):
                ranks[rank][name] = shard
    if cfg.quant.kv_cache_quant_algo:
        for rank in ranks:
            rank.update(_kv_scales(cfg, amax))
    for r, rank in enumerate(ranks):
        _check(cfg, rank, f"{weights.folder} rank {r}")
    return ranks


def write_checkpoint(folder: Path, cfg: TrtllmConfig, ranks: list[Tensors]) -> None:
    """config.json + rank{r}.safetensors into an existing, empty `folder`."""
    (folder / "config.json").write_text(json.dumps(cfg.to_dict(), indent=2) + "\n", encoding="utf-8")
    for r, tensors in enumerate(ranks):
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(folder / f"rank{r}.safetensors"))
