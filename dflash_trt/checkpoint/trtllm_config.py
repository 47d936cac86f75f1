"""`config.json` of a TensorRT-LLM checkpoint, written from and read back into our typed configs.

Field names are TRT-LLM 1.2.1's `PretrainedConfig` / `LLaMAConfig` / `QWenConfig` (`from_dict`
accepts them as-is); `quantization` is its `QuantConfig`. Two extra sections carry what TRT-LLM
has no field for: `dflash_trt` (target family, EOS / BOS ids) and, in the drafter's config,
`dflash` (block_size, mask_token_id, target_layer_ids, ...). TRT-LLM stores unknown keys as
attributes and ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from dflash_trt import __version__
from dflash_trt.checkpoint.configs import DraftConfig, RopeConfig, TargetConfig, TransformerDims, yarn_mscale
from dflash_trt.checkpoint.json_fields import Fields, load_json
from dflash_trt.errors import UnsupportedModelError

DRAFT_ARCHITECTURE = "DFlashDraftModel"
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}
DTYPE_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# QWenDecoderLayer reads config.seq_length and config.use_logn_attn for every qwen_type, but QWenConfig
# sets seq_length only in from_hugging_face (getattr(hf_config, "seq_length", 8192)): a checkpoint
# loaded with from_checkpoint must carry both (upstream tensorrt_llm/models/qwen/config.py@373970a, QWenConfig;
# tensorrt_llm/models/qwen/model.py, QWenDecoderLayer). 8192 / False are from_hugging_face's values for Qwen3.
QWEN3_FIELDS = {"qwen_type": "qwen3", "seq_length": 8192, "use_logn_attn": False}
DFLASH_FIELDS = ("block_size", "mask_token_id", "target_layer_ids", "num_target_layers", "layer_types",
                 "sliding_window", "is_causal", "input_embedding_scale", "output_multiplier",
                 "final_logit_softcapping")


@dataclass(frozen=True)
class QuantSection:
    """TRT-LLM `QuantConfig` (only the fields this toolkit sets; the rest keep TRT-LLM defaults)."""

    quant_algo: str | None = None  # None | "FP8" | "NVFP4"
    kv_cache_quant_algo: str | None = None  # None | "FP8"
    group_size: int = 128
    exclude_modules: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {
            "quant_algo": self.quant_algo, "kv_cache_quant_algo": self.kv_cache_quant_algo,
            "group_size": self.group_size, "smoothquant_val": 0.5, "clamp_val": None,
            "use_meta_recipe": False, "has_zero_point": False, "pre_quant_scale": False,
            "exclude_modules": list(self.exclude_modules) if self.quant_algo else None,
        }


@dataclass(frozen=True)
class TrtllmConfig:
    """One checkpoint's config: the model (target or drafter), storage dtype, TP size, quantization."""

    model: TargetConfig | DraftConfig
    dtype: str  # "bf16" | "fp16" | "fp32": tensors that are not quantized
    tp_size: int
    quant: QuantSection

    @property
    def is_draft(self) -> bool:
        return isinstance(self.model, DraftConfig)

    def to_dict(self) -> dict:
        m, d = self.model, self.model.dims
        qwen = self.is_draft or m.family == "qwen3"
        out = {
            "producer": {"name": "dflash-trt", "version": __version__},
            "architecture": DRAFT_ARCHITECTURE if self.is_draft else ARCHITECTURES[m.family],
            "dtype": DTYPE_NAMES[self.dtype], "logits_dtype": "float32",
            "vocab_size": m.vocab_size, "hidden_size": d.hidden_size, "num_hidden_layers": d.num_layers,
            "num_attention_heads": d.num_heads, "num_key_value_heads": d.num_kv_heads, "head_size": d.head_dim,
            "intermediate_size": d.intermediate_size, "hidden_act": "silu", "norm_epsilon": d.rms_norm_eps,
            "position_embedding_type": "rope_gpt_neox", "max_position_embeddings": d.max_position_embeddings,
            "rotary_base": d.rope.theta, "rotary_scaling": rope_scaling(d.rope), "rotary_embedding_dim": d.head_dim,
            "attn_bias": d.attention_bias, "mlp_bias": d.mlp_bias, "qk_layernorm": d.qk_norm,
            "mapping": {"world_size": self.tp_size, "tp_size": self.tp_size, "pp_size": 1},
            "quantization": self.quant.to_dict(),
            "use_parallel_embedding": False, "embedding_sharding_dim": 0,
        }
        if qwen:
            out.update(QWEN3_FIELDS)
        if self.is_draft:
            out["dflash"] = {k: _jsonable(getattr(m, k)) for k in DFLASH_FIELDS}
        else:
            out["tie_word_embeddings"] = m.tie_word_embeddings
            out["dflash_trt"] = {"family": m.family, "eos_token_ids": list(m.eos_token_ids),
                                 "bos_token_id": m.bos_token_id}
        return out


def _jsonable(value):
    return list(value) if isinstance(value, tuple) else value


def rope_scaling(rope: RopeConfig) -> dict | None:
    """HF-style `rope_scaling` as TRT-LLM reads it (both 'type' and 'rope_type' keys). Every yarn key is
    written: TensorRT-LLM's defaults differ from transformers' (original_max_position_embeddings 4096)."""
    if rope.type == "default":
        return None
    out = {"type": rope.type, "rope_type": rope.type, "factor": rope.factor}
    if rope.type == "llama3":
        out |= {"low_freq_factor": rope.low_freq_factor, "high_freq_factor": rope.high_freq_factor,
                "original_max_position_embeddings": rope.original_max_position_embeddings}
    if rope.type == "yarn":
        mscale, mscale_all_dim = trtllm_yarn_mscales(rope)
        out |= {"original_max_position_embeddings": rope.original_max_position_embeddings,
                "beta_fast": rope.beta_fast, "beta_slow": rope.beta_slow, "mscale": mscale,
                "mscale_all_dim": mscale_all_dim}
    return out


def trtllm_yarn_mscales(rope: RopeConfig) -> tuple[float, float]:
    """(mscale, mscale_all_dim) as TensorRT-LLM reads them (defaults 1.0, 0.0). Its table multiplies cos / sin by
    yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim) and reads neither `attention_factor` nor
    `truncate` (tensorrt_llm/functional.py, RopeEmbeddingUtils.create_sinusoidal_positions_yarn;
    tensorrt_llm/layers/attention.py, Attention.create_attention_const_params). transformers uses the ratio only
    when both are set, so a lone one is written as its no-op value."""
    if rope.mscale and rope.mscale_all_dim:
        return rope.mscale, rope.mscale_all_dim
    return 1.0, 0.0


def check_engine_rope(rope: RopeConfig, where: Path) -> None:
    """Refuse a target's yarn that the engine's RoPE table would compute differently from transformers."""
    if rope.type != "yarn":
        return
    if not rope.truncate:
        raise UnsupportedModelError(f"{where}: field '{rope.config_key}.truncate': false is not supported by "
                                    "TensorRT-LLM's yarn table (it always rounds the ramp bounds to integers); "
                                    "expected true")
    engine = trtllm_yarn_attention_factor(rope.factor, *trtllm_yarn_mscales(rope))
    if abs(engine - rope.attention_scaling()) > 1e-6 * engine:
        raise UnsupportedModelError(
            f"{where}: field '{rope.config_key}.attention_factor': {rope.attention_factor} differs from the "
            f"{engine:.6g} TensorRT-LLM's yarn table computes from factor / mscale / mscale_all_dim (it reads no "
            "attention_factor); expected it unset or equal")


def trtllm_yarn_attention_factor(factor: float, mscale: float, mscale_all_dim: float) -> float:
    """The factor on cos / sin of TensorRT-LLM's yarn table."""
    return yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)


def check_tp(dims: TransformerDims, tp: int, where: Path) -> None:
    """Heads and the MLP must split evenly over `tp` ranks; KV heads split, or are duplicated when fewer."""
    kv = dims.num_kv_heads
    problems = []
    if dims.num_heads % tp:
        problems.append(("num_attention_heads", f"{dims.num_heads} is not divisible by --tp {tp}"))
    if kv % tp and tp % kv:
        problems.append(("num_key_value_heads", f"{kv}: --tp {tp} must divide it or be a multiple of it"))
    if dims.intermediate_size % tp:
        problems.append(("intermediate_size", f"{dims.intermediate_size} is not divisible by --tp {tp}"))
    if problems:
        name, problem = problems[0]
        raise UnsupportedModelError(f"{where}: field '{name}': {problem}")


def local_dims(dims: TransformerDims, tp: int) -> TransformerDims:
    """The dims one rank holds: heads / tp, KV heads / tp (at least 1), intermediate / tp."""
    return replace(dims, num_heads=dims.num_heads // tp, num_kv_heads=max(dims.num_kv_heads // tp, 1),
                   intermediate_size=dims.intermediate_size // tp)


def padded_vocab(vocab_size: int, tp: int) -> int:
    """lm_head rows after zero-padding to a multiple of tp (TRT-LLM `pad_vocab_size`)."""
    return -(-vocab_size // tp) * tp


def _parse_rope(f: Fields) -> RopeConfig:
    theta = f.float("rotary_base", 10000.0)
    s = f.sub("rotary_scaling")
    kind = s.str("rope_type", None) or s.str("type", None) or "default"
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "linear":
        return RopeConfig(theta=theta, type=kind, factor=s.float("factor"))
    if kind == "yarn":  # read as the engine reads it: its defaults, its factor on cos / sin
        factor = s.float("factor", 1.0)
        scaling = trtllm_yarn_attention_factor(factor, s.float("mscale", 1.0), s.float("mscale_all_dim", 0.0))
        return RopeConfig(theta=theta, type=kind, factor=factor, beta_fast=s.float("beta_fast", 32.0),
                          beta_slow=s.float("beta_slow", 1.0), attention_factor=scaling,
                          original_max_position_embeddings=s.int("original_max_position_embeddings", 4096, minimum=1))
    if kind != "llama3":
        raise s.error("type", f"'{kind}' is not supported; expected default, linear, llama3 or yarn")
    return RopeConfig(theta=theta, type=kind, factor=s.float("factor"), low_freq_factor=s.float("low_freq_factor"),
                      high_freq_factor=s.float("high_freq_factor"),
                      original_max_position_embeddings=s.int("original_max_position_embeddings", minimum=1))


def _parse_dims(f: Fields) -> TransformerDims:
    heads = f.int("num_attention_heads", minimum=1)
    return TransformerDims(
        hidden_size=f.int("hidden_size", minimum=1), intermediate_size=f.int("intermediate_size", minimum=1),
        num_layers=f.int("num_hidden_layers", minimum=1), num_heads=heads,
        num_kv_heads=f.int("num_key_value_heads", heads, minimum=1), head_dim=f.int("head_size", minimum=1),
        rms_norm_eps=f.float("norm_epsilon"), rope=_parse_rope(f), attention_bias=f.bool("attn_bias", False),
        mlp_bias=f.bool("mlp_bias", False), qk_norm=f.bool("qk_layernorm", False),
        max_position_embeddings=f.int("max_position_embeddings", 32768, minimum=1),
    )


def _parse_quant(f: Fields) -> QuantSection:
    q = f.sub("quantization")
    return QuantSection(q.str("quant_algo", None), q.str("kv_cache_quant_algo", None), q.int("group_size", 128),
                        tuple(q.get("exclude_modules", list, [])))


def _parse_draft(f: Fields, dims: TransformerDims, vocab: int) -> DraftConfig:
    d = f.sub("dflash")
    return DraftConfig(
        vocab_size=vocab, dims=dims, block_size=d.int("block_size", minimum=2),
        mask_token_id=d.int("mask_token_id", minimum=0), target_layer_ids=tuple(d.int_list("target_layer_ids")),
        num_target_layers=d.int("num_target_layers", None), layer_types=tuple(d.get("layer_types", list)),
        sliding_window=d.int("sliding_window", None), is_causal=d.bool("is_causal", None),
        input_embedding_scale=d.float("input_embedding_scale", 1.0),
        output_multiplier=d.float("output_multiplier", 1.0),
        final_logit_softcapping=d.float("final_logit_softcapping", None),
    )


def _parse_target(f: Fields, dims: TransformerDims, vocab: int) -> TargetConfig:
    extra = f.sub("dflash_trt")
    family = extra.str("family")
    if ARCHITECTURES.get(family) != f.str("architecture"):
        raise extra.error("family", f"'{family}' does not match architecture '{f.str('architecture')}'")
    return TargetConfig(family=family, vocab_size=vocab, dims=dims,
                        tie_word_embeddings=f.bool("tie_word_embeddings", False),
                        eos_token_ids=tuple(extra.int_list("eos_token_ids", [])),
                        bos_token_id=extra.int("bos_token_id", None))


def read_trtllm_config(path: Path) -> TrtllmConfig:
    """Parse a checkpoint's config.json; every error names the file and the field."""
    f = Fields(load_json(path), path)
    arch = f.str("architecture")
    if arch != DRAFT_ARCHITECTURE and arch not in ARCHITECTURES.values():
        raise f.error("architecture", f"'{arch}' is not supported; expected one of "
                                      f"{sorted([*ARCHITECTURES.values(), DRAFT_ARCHITECTURE])}")
    dtype = next((k for k, v in DTYPE_NAMES.items() if v == f.str("dtype")), None)
    if dtype is None:
        raise f.error("dtype", f"'{f.str('dtype')}' is not one of {sorted(DTYPE_NAMES.values())}")
    mapping = f.sub("mapping")
    if mapping.int("pp_size", 1) != 1:
        raise mapping.error("pp_size", "pipeline parallelism is not supported; expected 1")
    tp = mapping.int("tp_size", 1, minimum=1)
    if mapping.int("world_size", tp) != tp:
        raise mapping.error("world_size", f"expected tp_size * pp_size = {tp}")
    dims, vocab = _parse_dims(f), f.int("vocab_size", minimum=1)
    model = _parse_draft(f, dims, vocab) if arch == DRAFT_ARCHITECTURE else _parse_target(f, dims, vocab)
    return TrtllmConfig(model=model, dtype=dtype, tp_size=tp, quant=_parse_quant(f))
