"""Typed model configs parsed from Hugging Face `config.json` files, field by field.

Targets: Qwen3 (`Qwen3ForCausalLM`) and Llama 3.x (`LlamaForCausalLM`). Drafters: z-lab DFlash
(`DFlashDraftModel`, a Qwen3-style backbone with `dflash_config`). Both transformers 4.x
(`rope_theta` + `rope_scaling`) and 5.x (`rope_parameters`) spellings are read.
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from dflash_trt.checkpoint.json_fields import Fields
from dflash_trt.errors import UnsupportedModelError

log = logging.getLogger(__name__)

TARGET_ARCHITECTURES = {"Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}
DRAFT_ARCHITECTURES = {"DFlashDraftModel": "dflash", "DFlash2DraftModel": "dflash2"}
ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature term: 0.1 * mscale * ln(factor) + 1 (1 when not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class RopeConfig:
    """Rotary embedding: theta plus an optional scaling rule (`ROPE_TYPES`)."""

    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    # yarn (Hugging Face's `_compute_yarn_parameters`): the ramp between beta_fast and beta_slow rotations, the
    # attention factor on cos / sin (None: 0.1 ln(factor) + 1, or the mscale ratio), truncate: integer bounds
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool = True
    # where the config spelled it ("rope_parameters" or "rope_scaling"): for error messages only
    config_key: str = field(default="rope_scaling", compare=False)

    def attention_scaling(self) -> float:
        """The factor yarn multiplies cos / sin by, as transformers' `_compute_yarn_parameters` (1.0 otherwise)."""
        if self.type != "yarn":
            return 1.0
        if self.attention_factor is not None:
            return self.attention_factor
        if self.mscale and self.mscale_all_dim:
            return yarn_mscale(self.factor, self.mscale) / yarn_mscale(self.factor, self.mscale_all_dim)
        return yarn_mscale(self.factor)

    def hf_parameters(self) -> dict:
        """The Hugging Face 5.x `rope_parameters` that `parse_rope` reads back as this config."""
        out: dict = {"rope_type": self.type, "rope_theta": self.theta}
        if self.type == "default":
            return out
        out["factor"] = self.factor
        if self.type == "llama3":
            out |= {"low_freq_factor": self.low_freq_factor, "high_freq_factor": self.high_freq_factor,
                    "original_max_position_embeddings": self.original_max_position_embeddings}
        elif self.type == "yarn":
            out |= {"original_max_position_embeddings": self.original_max_position_embeddings,
                    "beta_fast": self.beta_fast, "beta_slow": self.beta_slow, "truncate": self.truncate}
            out |= {key: value for key in ("attention_factor", "mscale", "mscale_all_dim")
                    if (value := getattr(self, key)) is not None}
        return out


@dataclass(frozen=True)
class TransformerDims:
    """Shapes shared by target and draft decoder stacks (Qwen3 / Llama layers)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = True
    max_position_embeddings: int = 32768


@dataclass(frozen=True)
class TargetConfig:
    family: str  # "qwen3" | "llama"
    vocab_size: int
    dims: TransformerDims
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DraftConfig:
    vocab_size: int
    dims: TransformerDims
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    layer_types: tuple[str, ...] = field(default_factory=tuple)
    sliding_window: int | None = None
    is_causal: bool | None = None
    input_embedding_scale: float = 1.0
    output_multiplier: float = 1.0
    final_logit_softcapping: float | None = None
    architecture: str = "dflash"  # "dflash" | "dflash2" (model/dflash2.py: convolutions + candidate selector)
    conv_kernel_size: int | None = None  # DFlash2 only, as the next three
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None

    @property
    def is_dflash2(self) -> bool:
        return self.architecture == "dflash2"

    def layer_is_causal(self, i: int) -> bool:
        if self.is_causal is not None:
            return self.is_causal
        return self.layer_types[i] == "sliding_attention"

    def layer_window(self, i: int) -> int | None:
        return self.sliding_window if self.layer_types[i] == "sliding_attention" else None

    def to_dict(self) -> dict:
        return asdict(self)


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's default taps: evenly spaced from layer 1 to L-3 (one draft layer: L // 2)."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def parse_rope(f: Fields) -> RopeConfig:
    rope = _parse_rope(f)
    return replace(rope, config_key="rope_parameters" if f.has("rope_parameters") else "rope_scaling")


def _parse_rope(f: Fields) -> RopeConfig:
    params = f.sub("rope_parameters") if f.has("rope_parameters") else None
    scaling = params if params is not None else f.sub("rope_scaling")
    theta = params.float("rope_theta", None) if params is not None else None
    theta = theta if theta is not None else f.float("rope_theta", 10000.0)
    kind = scaling.str("rope_type", None) or scaling.str("type", None) or "default"
    if kind not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"{f.path}: field '{scaling.prefix}rope_type': '{kind}' is not supported; "
            f"supported: {', '.join(ROPE_TYPES)}"
        )
    if kind == "default":
        return RopeConfig(theta=theta)
    if kind == "yarn":
        return _parse_yarn(f, scaling, theta)
    factor = scaling.float("factor")
    if kind == "linear":
        return RopeConfig(theta=theta, type=kind, factor=factor)
    return RopeConfig(
        theta=theta,
        type=kind,
        factor=factor,
        low_freq_factor=scaling.float("low_freq_factor"),
        high_freq_factor=scaling.float("high_freq_factor"),
        original_max_position_embeddings=scaling.int("original_max_position_embeddings", minimum=1),
    )


def _parse_yarn(f: Fields, scaling: Fields, theta: float) -> RopeConfig:
    """YaRN as transformers reads it: `factor` (null: max_position_embeddings / original), the rest optional."""
    original = scaling.int("original_max_position_embeddings", minimum=1)
    factor = scaling.float("factor", None)
    if factor is None:
        factor = f.int("max_position_embeddings", minimum=1) / original
    optional = {key: scaling.float(key, None) for key in ("attention_factor", "mscale", "mscale_all_dim")}
    return RopeConfig(
        theta=theta, type="yarn", factor=factor, original_max_position_embeddings=original,
        beta_fast=scaling.float("beta_fast", None) or 32.0, beta_slow=scaling.float("beta_slow", None) or 1.0,
        truncate=scaling.bool("truncate", True), **optional,
    )


def parse_dims(f: Fields, family: str) -> TransformerDims:
    hidden = f.int("hidden_size", minimum=1)
    heads = f.int("num_attention_heads", minimum=1)
    kv_heads = f.int("num_key_value_heads", heads, minimum=1)
    if heads % kv_heads:
        raise f.error("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}")
    head_dim = f.int("head_dim", None, minimum=1)
    if head_dim is None:
        if hidden % heads:
            raise f.error("head_dim", "missing and hidden_size is not a multiple of num_attention_heads")
        head_dim = hidden // heads
    act = f.str("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"{f.path}: field 'hidden_act': '{act}' is not supported; expected 'silu'")
    return TransformerDims(
        hidden_size=hidden,
        intermediate_size=f.int("intermediate_size", minimum=1),
        num_layers=f.int("num_hidden_layers", minimum=1),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=f.float("rms_norm_eps", 1e-6),
        rope=parse_rope(f),
        attention_bias=f.bool("attention_bias", False),
        mlp_bias=f.bool("mlp_bias", False) if family == "llama" else False,
        qk_norm=family == "qwen3",
        max_position_embeddings=f.int("max_position_embeddings", 32768, minimum=1),
    )


def _architecture(f: Fields, allowed: set[str] | dict) -> str:
    archs = f.get("architectures", list, [])
    known = [a for a in archs if a in allowed]
    if not known:
        raise UnsupportedModelError(
            f"{f.path}: field 'architectures': {archs or 'missing'} is not supported; "
            f"expected one of {sorted(allowed)}"
        )
    return known[0]


def parse_target_config(data: dict, path: Path) -> TargetConfig:
    f = Fields(data, path)
    family = TARGET_ARCHITECTURES[_architecture(f, TARGET_ARCHITECTURES)]
    eos = eos_field(f)
    return TargetConfig(
        family=family,
        vocab_size=f.int("vocab_size", minimum=1),
        dims=parse_dims(f, family),
        tie_word_embeddings=f.bool("tie_word_embeddings", False),
        eos_token_ids=eos,
        bos_token_id=f.int("bos_token_id", None),
    )


GENERATION_CONFIG = "generation_config.json"


def eos_field(f: Fields, strict: bool = False) -> tuple[int, ...]:
    """`eos_token_id` of a config: an id or a list of ids (none: ()); `strict`: each a non-negative int."""
    eos = f.get("eos_token_id", (int, list), [])
    eos = [eos] if isinstance(eos, int) else eos
    if strict and not all(type(e) is int and e >= 0 for e in eos):
        raise f.error("eos_token_id", f"expected a token id or a list of token ids, got {eos}")
    return tuple(int(e) for e in eos)


def generation_eos_ids(folder: Path) -> tuple[int, ...]:
    """`eos_token_id` of a model folder's generation_config.json, () without one.

    HF `generate` stops on every id listed there (GenerationConfig.from_pretrained reads this file;
    only without it does it fall back to config.json's): Qwen3 lists `<|endoftext|>` (151643) there
    beside config.json's 151645."""
    path = Path(folder) / GENERATION_CONFIG
    if not path.is_file():
        return ()
    from dflash_trt.checkpoint.json_fields import load_json

    return eos_field(Fields(load_json(path), path), strict=True)


def joined_eos(config_eos: tuple[int, ...], folder: Path) -> tuple[int, ...]:
    """config.json's EOS ids, then those generation_config.json adds (order kept)."""
    return config_eos + tuple(e for e in generation_eos_ids(folder) if e not in config_eos)


def with_generation_stops(config: TargetConfig, folder: Path) -> TargetConfig:
    """The config's EOS ids joined with generation_config.json's."""
    return replace(config, eos_token_ids=joined_eos(config.eos_token_ids, folder))


def _dflash_value(f: Fields, d: Fields, key: str, kind: str, default=None):
    """A DFlash setting: `dflash_config.<key>` first, then the top level (as z-lab reads it)."""
    source = d if d.has(key) else f
    return getattr(source, kind)(key, default)


# what z-lab's DFlashDraftModel reads from dflash_config (dflash/model.py @07ebd93: `_draft_value`)
DFLASH_CONFIG_KEYS = {"block_size", "mask_token_id", "target_layer_ids", "input_embedding_scale", "output_multiplier",
                      "final_logit_softcapping", "is_causal"}
DFLASH2_CONFIG_KEYS = {"conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"}
HF_SLIDING_WINDOW, HF_MAX_WINDOW_LAYERS = 4096, 28  # transformers Qwen3Config defaults


def _dflash2_fields(f: Fields, d: Fields, hidden_size: int) -> dict:
    """DFlash2's settings (z-lab reads each with `int(_draft_value(config, name))`: required, no default)."""
    out = {}
    for key in sorted(DFLASH2_CONFIG_KEYS):
        value = _dflash_value(f, d, key, "int")
        if value is None:
            raise d.error(key, "missing (required for DFlash2DraftModel)")
        if value < 1:
            raise d.error(key, f"must be >= 1, got {value}")
        out[key] = value
    if hidden_size % out["conv_group_size"]:
        raise d.error("conv_group_size", f"{out['conv_group_size']} does not divide hidden_size={hidden_size}")
    return out


def _layer_types(f: Fields, num_layers: int) -> tuple[list[str], int | None]:
    """(layer_types, sliding_window) as HF's Qwen3Config derives them, which z-lab's loader uses:
    sliding_window counts only with use_sliding_window (default 4096); without explicit layer_types, the
    layers from max_window_layers (default 28) on are 'sliding_attention' when a window is set."""
    sliding_window = None
    if f.get("use_sliding_window", bool, False):
        sliding_window = f.int("sliding_window", None if "sliding_window" in f.data else HF_SLIDING_WINDOW, minimum=1)
    layer_types = f.get("layer_types", list, None)
    if layer_types is None:
        first = f.int("max_window_layers", HF_MAX_WINDOW_LAYERS, minimum=0)
        layer_types = ["sliding_attention" if sliding_window is not None and i >= first else "full_attention"
                       for i in range(num_layers)]
    if len(layer_types) != num_layers or set(layer_types) - {"full_attention", "sliding_attention"}:
        raise f.error("layer_types",
                      f"expected {num_layers} entries of 'full_attention'/'sliding_attention', got {layer_types}")
    return layer_types, sliding_window


def parse_draft_config(data: dict, path: Path) -> DraftConfig:
    f = Fields(data, path)
    if f.has("draft_vocab_size"):
        raise UnsupportedModelError(
            f"{path}: field 'draft_vocab_size': speculators-format drafters (own reduced vocab, "
            "d2t/t2d maps) are not supported; convert to the z-lab format"
        )
    architecture = DRAFT_ARCHITECTURES[_architecture(f, DRAFT_ARCHITECTURES)]
    d = f.sub("dflash_config")
    dims = parse_dims(f, "qwen3")
    num_target_layers = f.int("num_target_layers", None, minimum=1)
    ids = _dflash_value(f, d, "target_layer_ids", "int_list")
    if ids is None:
        if num_target_layers is None:
            raise d.error("target_layer_ids", "missing (and no num_target_layers to derive it)")
        ids = default_target_layer_ids(num_target_layers, dims.num_layers)
    if not ids or len(set(ids)) != len(ids):
        raise d.error("target_layer_ids", f"expected distinct layer ids, got {ids}")
    layer_types, sliding_window = _layer_types(f, dims.num_layers)
    if d.has("is_causal") and not f.has("is_causal"):
        log.warning("%s: field 'dflash_config.is_causal' is ignored: z-lab's loader reads is_causal at the top "
                    "level only (absent there: sliding layers causal, full-attention layers bidirectional)", path)
    known = DFLASH_CONFIG_KEYS | (DFLASH2_CONFIG_KEYS if architecture == "dflash2" else set())
    unknown = sorted(set(d.data) - known)
    if unknown:
        hint = "" if architecture == "dflash2" or unknown[0] not in DFLASH2_CONFIG_KEYS else \
            " (a DFlash2 field: DFlash2 drafters say architectures: [DFlash2DraftModel])"
        what = "DFlash2" if architecture == "dflash2" else "DFlash (v1)"
        raise d.error(unknown[0], f"not a {what} setting{hint}; known: {', '.join(sorted(known))}")
    dflash2 = _dflash2_fields(f, d, dims.hidden_size) if architecture == "dflash2" else {}
    mask_token_id = _dflash_value(f, d, "mask_token_id", "int")
    if mask_token_id is None:
        raise d.error("mask_token_id", "missing (required): the token id the drafter was trained with in "
                                       "masked block slots (z-lab writes it in dflash_config)")
    softcap = _dflash_value(f, d, "final_logit_softcapping", "float")
    config = DraftConfig(
        vocab_size=f.int("vocab_size", minimum=1),
        dims=dims,
        block_size=_dflash_value(f, d, "block_size", "int", 16),
        mask_token_id=mask_token_id,
        target_layer_ids=tuple(ids),
        num_target_layers=num_target_layers,
        layer_types=tuple(layer_types),
        sliding_window=sliding_window,
        is_causal=f.bool("is_causal", None),  # top level only, as z-lab reads it
        input_embedding_scale=_dflash_value(f, d, "input_embedding_scale", "float", 1.0),
        output_multiplier=_dflash_value(f, d, "output_multiplier", "float", 1.0),
        final_logit_softcapping=softcap if softcap and softcap > 0 else None,
        architecture=architecture,
        **dflash2,
    )
    if config.block_size < 2:
        raise f.error("block_size", f"must be >= 2, got {config.block_size}")
    if not math.isfinite(config.output_multiplier):
        raise f.error("output_multiplier", "must be finite")
    return config
