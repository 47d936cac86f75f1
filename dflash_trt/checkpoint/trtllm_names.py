"""Hugging Face -> TensorRT-LLM tensor names, as data (TRT-LLM 1.2.1 `LLaMAForCausalLM` / `QWenForCausalLM`).

`{}` is the layer index. `None` drops a tensor. Several HF names mapping to one TRT-LLM name are
fused by concatenation along dim 0 in the order of `FUSIONS`. A name matched by no template is
an error that lists it (`group_names`). Note the MLP swap: HF `gate_proj` (the SiLU branch) is
TRT-LLM `mlp.fc`, HF `up_proj` is `mlp.gate`.

The drafter uses the same per-layer names under `transformer.layers.{}` plus its own tensors
under `dflash.` (docs/conversion.md): it has no `vocab_embedding` and no `lm_head` (both are the
target's), and its final `norm` is `transformer.ln_f`.
"""

from __future__ import annotations

import re

from dflash_trt.errors import CheckpointError

LAYER_NAMES: dict[str, str | None] = {  # HF name under a layer -> TRT-LLM name under transformer.layers.{}
    "input_layernorm.weight": "input_layernorm.weight",
    "post_attention_layernorm.weight": "post_layernorm.weight",
    "self_attn.q_proj.weight": "attention.qkv.weight",
    "self_attn.k_proj.weight": "attention.qkv.weight",
    "self_attn.v_proj.weight": "attention.qkv.weight",
    "self_attn.q_proj.bias": "attention.qkv.bias",
    "self_attn.k_proj.bias": "attention.qkv.bias",
    "self_attn.v_proj.bias": "attention.qkv.bias",
    "self_attn.o_proj.weight": "attention.dense.weight",
    "self_attn.o_proj.bias": "attention.dense.bias",
    "self_attn.q_norm.weight": "attention.q_layernorm.weight",  # Qwen3 per-head RMSNorm
    "self_attn.k_norm.weight": "attention.k_layernorm.weight",
    "mlp.gate_proj.weight": "mlp.fc.weight",  # swapped names: HF gate = TRT-LLM fc
    "mlp.up_proj.weight": "mlp.gate.weight",
    "mlp.down_proj.weight": "mlp.proj.weight",
    "mlp.gate_proj.bias": "mlp.fc.bias",
    "mlp.up_proj.bias": "mlp.gate.bias",
    "mlp.down_proj.bias": "mlp.proj.bias",
    "self_attn.rotary_emb.inv_freq": None,  # recomputed from the config
}



def _layers(hf_prefix: str) -> dict[str, str | None]:
    """LAYER_NAMES under `hf_prefix` (e.g. 'model.layers.{}.') -> under 'transformer.layers.{}.'."""
    return {hf_prefix + hf: None if trt is None else "transformer.layers.{}." + trt for hf, trt in LAYER_NAMES.items()}


TARGET_NAMES: dict[str, str | None] = {
    "model.embed_tokens.weight": "transformer.vocab_embedding.weight",
    "model.norm.weight": "transformer.ln_f.weight",
    "lm_head.weight": "lm_head.weight",  # written even when tied (a copy of the embedding)
    **_layers("model.layers.{}."),
}

DRAFT_NAMES: dict[str, str | None] = {
    "fc.weight": "dflash.fc.weight",  # [H, n*H]: target_hidden -> context features
    "hidden_norm.weight": "dflash.hidden_norm.weight",
    "norm.weight": "transformer.ln_f.weight",
    **_layers("layers.{}."),
}

FUSIONS: dict[str, tuple[str, ...]] = {  # TRT-LLM suffix -> HF suffixes, concatenated in this order
    "attention.qkv.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "attention.qkv.bias": ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
}

# Tensor-parallel layout of every sharded linear (anything else is replicated on every rank):
#   qkv    rows split per part: [q_r | k_r | v_r], K/V heads duplicated first when kv_heads < tp
#   column rows (output features) split
#   row    columns (input features) split; bias replicated (added once, after the all-reduce)
#   vocab  rows split after zero-padding the vocabulary to a multiple of tp
LINEAR_SPLITS = {
    "attention.qkv": "qkv",
    "attention.dense": "row",
    "mlp.fc": "column",
    "mlp.gate": "column",
    "mlp.proj": "row",
    "lm_head": "vocab",
}
QUANTIZED_LINEARS = ("attention.qkv", "attention.dense", "mlp.fc", "mlp.gate", "mlp.proj")
# Linears TRT-LLM runs as one GEMM share one weight amax (Model Optimizer unifies them too).
SHARED_WEIGHT_AMAX = (("mlp.fc", "mlp.gate"),)
# HF modules whose inputs a TRT-LLM linear sees (for activation amax).
LINEAR_INPUTS = {
    "attention.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "attention.dense": ("self_attn.o_proj",),
    "mlp.fc": ("mlp.gate_proj",),
    "mlp.gate": ("mlp.up_proj",),
    "mlp.proj": ("mlp.down_proj",),
}


def _pattern(template: str) -> re.Pattern:
    return re.compile(re.escape(template).replace(r"\{\}", r"(\d+)") + "$")


def group_names(names: dict[str, str | None], hf_names, where) -> dict[str, list[str]]:
    """TRT-LLM name -> the HF names it is made of (fusion order); unmapped names are an error."""
    patterns = [(_pattern(hf), trt) for hf, trt in names.items()]
    groups: dict[str, list[tuple[int, str]]] = {}
    unmapped = []
    for hf_name in sorted(hf_names):
        match = next(((m, trt) for p, trt in patterns if (m := p.match(hf_name))), None)
        if match is None:
            unmapped.append(hf_name)
            continue
        m, trt = match
        if trt is None:
            continue
        trt_name = trt.replace("{}", m.group(1)) if m.groups() else trt
        groups.setdefault(trt_name, []).append((_fusion_index(hf_name, trt_name), hf_name))
    if unmapped:
        raise CheckpointError(f"{where}: no TensorRT-LLM name for tensors: {', '.join(unmapped)}")
    return {trt: [hf for _, hf in sorted(parts)] for trt, parts in groups.items()}


def _fusion_index(hf_name: str, trt_name: str) -> int:
    for suffix, parts in FUSIONS.items():
        if trt_name.endswith(suffix):
            return next(i for i, p in enumerate(parts) if hf_name.endswith(p))
    return 0


def linear_of(trt_name: str) -> tuple[str, str] | None:
    """'transformer.layers.3.mlp.fc.weight' -> ('mlp.fc', 'weight'); None for non-linears."""
    for linear in LINEAR_SPLITS:
        head, sep, suffix = trt_name.partition(f"{linear}.")
        if sep and (head == "" or head.endswith(".")) and "." not in suffix:
            return linear, suffix
    return None


def hf_names_of(names: dict[str, str | None], trt_name: str) -> list[str]:
    """Inverse map: the HF names (fusion order) a TRT-LLM tensor name unpacks to."""
    out = []
    for hf, trt in names.items():
        if trt is None:
            continue
        m = _pattern(trt).match(trt_name)
        if m:
            out.append(hf.replace("{}", m.group(1)) if m.groups() else hf)
    return sorted(out, key=lambda hf: _fusion_index(hf, trt_name))
