"""Tensor-parallel layout of a TensorRT-LLM checkpoint: how full tensors split into rank shards,
and the exact name -> (shape, dtype) every `rank{r}.safetensors` must hold.

The split rule of each linear is `LINEAR_SPLITS` (trtllm_names). Quantized tensors split like
their weight: FP8 weights and NVFP4 packed weights / block scales are indexed [out, in'] with
in' = in, in / 2 or in / 16, so whole bytes and whole 16-blocks stay on one rank (NVFP4 needs
(in / tp) % 16 == 0, checked by the handler on local shapes). Per-tensor scales are replicated.
"""

from __future__ import annotations

import torch

from dflash_trt.checkpoint.configs import TransformerDims
from dflash_trt.checkpoint.quant.modes import KV_SCALE_SPEC, handler_for_algo
from dflash_trt.checkpoint.trtllm_config import TrtllmConfig, local_dims, padded_vocab
from dflash_trt.checkpoint.trtllm_names import LINEAR_SPLITS, QUANTIZED_LINEARS, linear_of

Spec = dict[str, tuple[tuple[int, ...], torch.dtype]]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SPLIT_SUFFIXES = ("weight", "bias", "weights_scaling_factor")  # only tensors indexed by features


def duplicate_kv_heads(t: torch.Tensor, head_dim: int, tp: int, kv_heads: int) -> torch.Tensor:
    """K or V rows [kv*hd, ...] -> [tp*hd, ...]: each head repeated so every rank gets its own copy."""
    if kv_heads >= tp:
        return t
    heads = t.unflatten(0, (kv_heads, head_dim))
    return heads.repeat_interleave(tp // kv_heads, dim=0).flatten(0, 1)


def split_tensor(name: str, t: torch.Tensor, dims: TransformerDims, tp: int, vocab: int) -> list[torch.Tensor]:
    """One full tensor -> its `tp` shards (the same tensor `tp` times when replicated)."""
    linear = linear_of(name)
    rule = LINEAR_SPLITS.get(linear[0]) if linear else None
    suffix = linear[1] if linear else ""
    if tp == 1 or rule is None or suffix not in SPLIT_SUFFIXES or t.dim() < (2 if suffix != "bias" else 1):
        return [t] * tp
    if rule == "qkv":
        q, kv = dims.num_heads * dims.head_dim, dims.num_kv_heads * dims.head_dim
        parts = [p if i == 0 else duplicate_kv_heads(p, dims.head_dim, tp, dims.num_kv_heads)
                 for i, p in enumerate(t.split([q, kv, kv]))]
        chunks = [p.chunk(tp) for p in parts]
        return [torch.cat([c[r] for c in chunks]).contiguous() for r in range(tp)]
    if rule == "row":
        return [t] * tp if suffix == "bias" else [c.contiguous() for c in t.chunk(tp, dim=1)]
    if rule == "vocab":
        t = torch.cat([t, t.new_zeros(padded_vocab(vocab, tp) - t.shape[0], *t.shape[1:])])
    return [c.contiguous() for c in t.chunk(tp, dim=0)]


def linear_shapes(dims: TransformerDims) -> dict[str, tuple[int, int]]:
    """(out, in) of every layer linear for `dims` (pass local dims for one rank's shapes)."""
    h, hd, i = dims.hidden_size, dims.head_dim, dims.intermediate_size
    return {
        "attention.qkv": ((dims.num_heads + 2 * dims.num_kv_heads) * hd, h),
        "attention.dense": (h, dims.num_heads * hd),
        "mlp.fc": (i, h),
        "mlp.gate": (i, h),
        "mlp.proj": (h, i),
    }


def _layer_spec(cfg: TrtllmConfig, dims: TransformerDims, layer: int) -> Spec:
    dtype, p = DTYPES[cfg.dtype], f"transformer.layers.{layer}."
    handler = handler_for_algo(cfg.quant.quant_algo)
    spec = {p + "input_layernorm.weight": ((dims.hidden_size,), dtype),
            p + "post_layernorm.weight": ((dims.hidden_size,), dtype)}
    if dims.qk_norm:
        spec |= {p + f"attention.{n}_layernorm.weight": ((dims.head_dim,), dtype) for n in "qk"}
    for linear, (out, inp) in linear_shapes(dims).items():
        h = handler if linear in QUANTIZED_LINEARS else handler_for_algo(None)
        spec |= {f"{p}{linear}.{suffix}": s for suffix, s in h.spec(out, inp, dtype).items()}
        has_bias = dims.attention_bias if linear.startswith("attention") else dims.mlp_bias
        if has_bias:
            spec[f"{p}{linear}.bias"] = ((out,), dtype)  # row-parallel: out is full, replicated
    if cfg.quant.kv_cache_quant_algo:
        spec[p + "attention.kv_cache_scaling_factor"] = KV_SCALE_SPEC
    return spec


def expected_tensors(cfg: TrtllmConfig) -> Spec:
    """name -> (shape, dtype) that every rank file of this checkpoint holds (rank-independent)."""
    full, dtype, tp = cfg.model.dims, DTYPES[cfg.dtype], cfg.tp_size
    dims, h = local_dims(full, tp), full.hidden_size
    spec: Spec = {"transformer.ln_f.weight": ((h,), dtype)}
    if cfg.is_draft:
        n_taps = len(cfg.model.target_layer_ids)
        spec |= {"dflash.fc.weight": ((h, n_taps * h), dtype), "dflash.hidden_norm.weight": ((h,), dtype)}
    else:
        vocab = cfg.model.vocab_size
        spec |= {"transformer.vocab_embedding.weight": ((vocab, h), dtype),
                 "lm_head.weight": ((padded_vocab(vocab, tp) // tp, h), dtype)}
    for layer in range(full.num_layers):
        spec |= _layer_spec(cfg, dims, layer)
    return spec


# config.json field that sets each linear's input features (named in errors)
LINEAR_IN_FIELDS = {"attention.qkv": "hidden_size", "attention.dense": "num_attention_heads",
                    "mlp.fc": "hidden_size", "mlp.gate": "hidden_size", "mlp.proj": "intermediate_size"}


def check_quantizable(cfg: TrtllmConfig) -> tuple[str, str] | None:
    """(config field, problem) when a linear's per-rank shape cannot take the quantization, else None."""
    handler = handler_for_algo(cfg.quant.quant_algo)
    for linear, (out, inp) in linear_shapes(local_dims(cfg.model.dims, cfg.tp_size)).items():
        problem = handler.check(out, inp)
        if problem:
            rank = f" per rank at tp={cfg.tp_size}" if cfg.tp_size > 1 else ""
            return LINEAR_IN_FIELDS[linear], f"{handler.name} cannot quantize {linear}: {problem}{rank}"
    return None
