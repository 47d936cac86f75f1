"""Readers for Hugging Face target folders and z-lab DFlash drafter folders.

JSON and safetensors only; checkpoint code is never executed. Each reader checks every tensor
name and shape against config.json before anything is loaded, and `check_pair` checks that a
drafter fits its target (hidden size, vocab, tapped layers, mask token).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dflash_trt.checkpoint.configs import (
    DraftConfig,
    TargetConfig,
    TransformerDims,
    parse_draft_config,
    parse_target_config,
    with_generation_stops,
)
from dflash_trt.checkpoint.json_fields import load_json
from dflash_trt.checkpoint.weights import WeightFiles, check_tensors
from dflash_trt.errors import CheckpointError

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


@dataclass
class TargetCheckpoint:
    folder: Path
    config: TargetConfig
    weights: WeightFiles


@dataclass
class DraftCheckpoint:
    folder: Path
    config: DraftConfig
    weights: WeightFiles


def layer_shapes(dims: TransformerDims, prefix: str) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of one Qwen3 / Llama decoder layer under `prefix`."""
    h, i, hd = dims.hidden_size, dims.intermediate_size, dims.head_dim
    q, kv = dims.num_heads * hd, dims.num_kv_heads * hd
    shapes = {
        "input_layernorm.weight": (h,),
        "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q),
        "mlp.gate_proj.weight": (i, h),
        "mlp.up_proj.weight": (i, h),
        "mlp.down_proj.weight": (h, i),
    }
    if dims.qk_norm:
        shapes |= {"self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,)}
    if dims.attention_bias:
        shapes |= {f"self_attn.{p}_proj.bias": (n,) for p, n in (("q", q), ("k", kv), ("v", kv), ("o", h))}
    if dims.mlp_bias:
        shapes |= {"mlp.gate_proj.bias": (i,), "mlp.up_proj.bias": (i,), "mlp.down_proj.bias": (h,)}
    return {prefix + name: shape for name, shape in shapes.items()}


def target_shapes(config: TargetConfig) -> dict[str, tuple[int, ...]]:
    d = config.dims
    shapes = {"model.embed_tokens.weight": (config.vocab_size, d.hidden_size), "model.norm.weight": (d.hidden_size,)}
    for layer in range(d.num_layers):
        shapes |= layer_shapes(d, f"model.layers.{layer}.")
    shapes["lm_head.weight"] = (config.vocab_size, d.hidden_size)
    return shapes


def draft_shapes(config: DraftConfig) -> dict[str, tuple[int, ...]]:
    d = config.dims
    shapes = {
        "fc.weight": (d.hidden_size, len(config.target_layer_ids) * d.hidden_size),
        "hidden_norm.weight": (d.hidden_size,),
        "norm.weight": (d.hidden_size,),
    }
    for layer in range(d.num_layers):
        shapes |= layer_shapes(d, f"layers.{layer}.")
        if config.is_dflash2:  # model/dflash2.py
            k, g = config.conv_kernel_size, d.hidden_size // config.conv_group_size
            for conv in ("attention_conv", "mlp_conv"):
                shapes[f"layers.{layer}.{conv}.base_kernel"] = (2, k, d.hidden_size)
                shapes[f"layers.{layer}.{conv}.kernel_projection.weight"] = (2 * k * g, d.hidden_size)
    if config.is_dflash2:
        shapes["candidate_selector.hidden_projection.weight"] = (config.selector_rank, d.hidden_size)
        shapes["candidate_selector.predecessor_codebook"] = (config.vocab_size, config.selector_rank)
        shapes["candidate_selector.successor_codebook"] = (config.vocab_size, config.selector_rank)
    return shapes


def _ignored(weights: WeightFiles) -> set[str]:
    return {n for n in weights.names() if n.endswith(IGNORED_SUFFIXES)}


def read_target(folder: str | Path) -> TargetCheckpoint:
    """Parse and check a Qwen3 / Llama HF folder (config.json + safetensors)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: target folder not found")
    config = parse_target_config(load_json(folder / "config.json"), folder / "config.json")
    config = with_generation_stops(config, folder)  # HF generate stops on generation_config.json's ids too
    weights = WeightFiles(folder)
    optional = {"lm_head.weight"} if config.tie_word_embeddings else set()
    check_tensors(weights, target_shapes(config), optional=optional, ignored=_ignored(weights))
    return TargetCheckpoint(folder, config, weights)


def read_draft(folder: str | Path) -> DraftCheckpoint:
    """Parse and check a z-lab DFlash drafter folder (no embeddings, no lm_head)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: draft folder not found")
    config = parse_draft_config(load_json(folder / "config.json"), folder / "config.json")
    weights = WeightFiles(folder)
    borrowed = {n for n in weights.names() if n.split(".")[-2] in ("embed_tokens", "lm_head")}
    if borrowed:
        raise CheckpointError(
            f"{folder}: drafter carries {sorted(borrowed)}; DFlash drafters borrow the target's "
            "embed_tokens and lm_head and must not ship their own"
        )
    check_tensors(weights, draft_shapes(config), ignored=_ignored(weights))
    return DraftCheckpoint(folder, config, weights)


def check_pair(target: TargetCheckpoint, draft: DraftCheckpoint) -> None:
    """The drafter reads this target: same hidden size and vocab, taps in range, mask id valid."""
    t, d = target.config, draft.config
    where = draft.folder / "config.json"

    def mismatch(field: str, problem: str) -> CheckpointError:
        return CheckpointError(f"{where}: field '{field}': {problem} (target: {target.folder})")

    if d.dims.hidden_size != t.dims.hidden_size:
        raise mismatch("hidden_size", f"{d.dims.hidden_size} != target hidden_size {t.dims.hidden_size}")
    if d.vocab_size != t.vocab_size:
        raise mismatch("vocab_size", f"{d.vocab_size} != target vocab_size {t.vocab_size}")
    if d.num_target_layers is not None and d.num_target_layers != t.dims.num_layers:
        raise mismatch("num_target_layers", f"{d.num_target_layers} != target num_hidden_layers {t.dims.num_layers}")
    bad = [i for i in d.target_layer_ids if not 0 <= i < t.dims.num_layers]
    if bad:
        raise mismatch(
            "dflash_config.target_layer_ids",
            f"{bad} outside the target's layers 0..{t.dims.num_layers - 1}",
        )
    if not 0 <= d.mask_token_id < t.vocab_size:
        raise mismatch(
            "dflash_config.mask_token_id",
            f"{d.mask_token_id} is not a row of the target embedding (vocab {t.vocab_size})",
        )
