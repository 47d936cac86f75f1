"""`dflash-trt build` for `backend: trtllm`: fill a bundle folder with the paired engines.

`plan_trtllm_build(cfg, tmp_dir)` does everything that needs no GPU stack: config checks, the
pair's dims, the draft graph spec, the target's model-class settings and the trtllm-build argv
(CPU tests inspect it). `build_trtllm_bundle(cfg, tmp_dir, log)` executes it:

1. convert the HF pair to a TensorRT-LLM checkpoint (quantized per `quant` / `kv_cache`) beside tmp_dir;
2. copy the DFlashVerify plugin library to tmp_dir/plugin, write the model class file, run trtllm-build
   into tmp_dir/target (plus the target's tokenizer files);
3. export the drafter to ONNX (tmp_dir/draft) and compile both graphs with TensorRT;
4. write dflash_engine.json.

`TrtllmBackend` is this backend's side of the build contract (engine/backend.py): `engine.build.build_bundle`
checks, reuses and writes the manifest, and has the runtime decode the golden prompts through the built
engines with the scheduler (runtime/golden.py); `fill` returns what the manifest records.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from dflash_trt.backends.trtllm import versions
from dflash_trt.backends.trtllm.io_spec import ENGINE_CONFIG_FILE, DraftGraphSpec, describe_reserved, engine_config
from dflash_trt.backends.trtllm.plugin import DFLASH_VERIFY, LIBRARY_NAME
from dflash_trt.backends.trtllm.target_build import (
    class_name,
    engine_lengths,
    target_outputs,
    target_settings,
    trtllm_build_args,
)
from dflash_trt.checkpoint.hf import check_pair, read_draft, read_target
from dflash_trt.engine.backend import FilledBundle, Log
from dflash_trt.engine.config import BuildConfig
from dflash_trt.errors import ConfigError, UnsupportedModelError

PURPOSE = "backend 'trtllm' (dflash-trt build)"


@dataclass
class TrtllmPlan:
    family: str
    dtype: str  # bf16 | fp16 | fp32: engine and draft graph dtype
    block_size: int
    draft_spec: DraftGraphSpec
    settings: dict  # dflash_target.json
    build_args: list[str]  # trtllm-build flags
    checkpoint_dir: Path  # converted checkpoint (scratch, beside tmp_dir)
    target_num_layers: int
    trained_block_size: int
    sampled: bool = True  # runtime.sampled_requests: the engine emits the tail block's logits
    has_tokenizer: bool = False
    notes: list[str] = field(default_factory=list)


def resolve_dtype(cfg: BuildConfig) -> str:
    return "bf16" if cfg.dtype == "auto" else cfg.dtype


def check_config(cfg: BuildConfig) -> None:
    where = cfg.source or cfg.name
    if cfg.backend != "trtllm":
        raise ConfigError(f"{where}: field 'backend': build_trtllm_bundle needs 'trtllm', got {cfg.backend!r}")
    if cfg.tp != 1:
        raise ConfigError(f"{where}: field 'tp': the trtllm backend serves tp=1 engines in this version (the "
                          "executor's multi-rank LEADER mode is not wired); set tp: 1")
    if cfg.kv_cache == "fp8" and cfg.quant == "none":
        # trtllm-build (tensorrt_llm/builder.py, build()): with non-FP8 / NVFP4 weights it turns
        # use_fp8_context_fmha off ("must be used together with the fp8 quantization workflow") and then,
        # with an FP8 KV cache, use_paged_context_fmha too, which prompt-append's KV reuse needs.
        raise ConfigError(f"{where}: field 'kv_cache': fp8 with quant: none is refused for backend trtllm: "
                          "TensorRT-LLM 1.2.1 disables paged context FMHA for an FP8 KV cache unless the weights are "
                          "FP8 or NVFP4, and the paired engines need it; set quant: fp8 (or nvfp4), or kv_cache: auto")
    if cfg.quant != "none" and resolve_dtype(cfg) == "fp32":
        raise ConfigError(f"{where}: field 'dtype': {cfg.quant} engines keep unquantized tensors in bf16 or fp16, "
                          "not fp32; set dtype: bf16 (or auto)")


def read_pair(cfg: BuildConfig):
    """The HF pair, with a pointer to route B when the target is outside the converter's families."""
    from dflash_trt.backends.trtllm.llmapi import refuse_dflash2

    refuse_dflash2(cfg.draft_path(), "route A")
    try:
        target, draft = read_target(cfg.target_path()), read_draft(cfg.draft_path())
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(
            f"{exc.format_message()}. The paired-engine backend converts Qwen3 / Llama 3.x targets only; "
            f"TensorRT-LLM's native DFlash may serve this pair: dflash-trt export trtllm-llmapi --config {cfg.source}"
        ) from None
    check_pair(target, draft)
    return target, draft


def plan_trtllm_build(cfg: BuildConfig, tmp_dir: str | Path) -> TrtllmPlan:
    """Checks, dims, settings and argv of a trtllm build (no GPU stack needed)."""
    check_config(cfg)
    tmp_dir = Path(tmp_dir)
    target, draft = read_pair(cfg)
    d, t = draft.config, target.config
    block_size = cfg.block_size or d.block_size
    if block_size > d.block_size:
        raise ConfigError(f"{cfg.source}: field 'block_size': {block_size} exceeds the drafter's trained block_size "
                          f"{d.block_size}")
    dtype, runtime = resolve_dtype(cfg), cfg.runtime
    positions = engine_lengths(runtime.max_seq_len, block_size, runtime.max_batch_size)["max_seq_len"]
    if t.dims.rope.type == "yarn" and positions > t.dims.max_position_embeddings:
        # TensorRT-LLM's yarn cos / sin table has max_position_embeddings rows and the attention kernels index
        # it by position unclamped (tensorrt_llm/layers/attention.py, Attention.create_attention_const_params);
        # yarn lives only in that table (the kernels' RotaryScalingType has no yarn); other types were not read
        raise ConfigError(f"{cfg.source}: field 'runtime.max_seq_len': {runtime.max_seq_len} needs {positions} "
                          f"engine positions, past the {t.dims.max_position_embeddings} rows of the target's yarn "
                          f"table (max_position_embeddings); expected <= "
                          f"{runtime.max_seq_len - positions + t.dims.max_position_embeddings}")
    spec = DraftGraphSpec(
        num_layers=d.dims.num_layers, num_kv_heads=d.dims.num_kv_heads, head_dim=d.dims.head_dim,
        hidden_size=d.dims.hidden_size, n_taps=len(d.target_layer_ids), block_size=block_size,
        capacity=runtime.max_seq_len + block_size + 1, vocab_size=t.vocab_size, mask_token_id=d.mask_token_id,
        dtype=dtype, max_batch_size=runtime.max_batch_size, target_layer_ids=tuple(d.target_layer_ids),
        sampled=runtime.sampled_requests)
    checkpoint_dir = tmp_dir.with_name(tmp_dir.name + ".ckpt")
    args = trtllm_build_args(checkpoint_dir / "target", tmp_dir / "target", t.family, cfg.quant, cfg.kv_cache,
                             runtime.max_batch_size, runtime.max_seq_len, block_size)
    from dflash_trt.tokenizer import has_tokenizer

    class_name(t.family)
    sampled = cfg.runtime.sampled_requests
    return TrtllmPlan(t.family, dtype, block_size, spec,
                      target_settings(t.family, spec, t.dims.num_layers, dtype, sampled), args, checkpoint_dir,
                      t.dims.num_layers, d.block_size, sampled, has_tokenizer(target.folder))


def reserved_bytes(plan: TrtllmPlan, runtime) -> dict[str, int]:
    """What the target executor reserves for the DFlash outputs at start (io_spec.TargetOutputs.reserved_bytes)."""
    tokens = engine_lengths(runtime.max_seq_len, plan.block_size, runtime.max_batch_size)["max_num_tokens"]
    return target_outputs(plan.draft_spec, plan.dtype, plan.sampled).reserved_bytes(tokens)


def pair_info(plan: TrtllmPlan) -> dict:
    """The manifest fields the torch backend writes (backends/torch/bundle.py `pair_info`), plus trtllm's."""
    s = plan.draft_spec
    return {
        "block_size": plan.block_size,
        "mask_token_id": s.mask_token_id,
        "target_layer_ids": list(s.target_layer_ids),
        "target": {"family": plan.family, "vocab_size": s.vocab_size, "num_layers": plan.target_num_layers},
        "draft": {"num_layers": s.num_layers, "trained_block_size": plan.trained_block_size},
        "has_tokenizer": plan.has_tokenizer,
        "trtllm": {"engine_config": ENGINE_CONFIG_FILE, "dtype": plan.dtype},
    }


def installed_versions() -> dict:
    return {m: versions.installed_version(m) for m in ("tensorrt_llm", "tensorrt", "torch", "onnx")}


def write_engine_config(tmp_dir: Path, plan: TrtllmPlan, library: Path) -> dict:
    target = target_outputs(plan.draft_spec, plan.dtype, plan.sampled)
    plugin = {**DFLASH_VERIFY.to_dict(), "library": f"plugin/{LIBRARY_NAME}", "source_library": str(library)}
    config = engine_config(plan.draft_spec, target, ["trtllm-build", *plan.build_args], plugin,
                           installed_versions(), plan.family)
    (tmp_dir / ENGINE_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return config


class TrtllmBackend:
    name = "trtllm"

    def fill(self, cfg: BuildConfig, tmp: Path, log: Log) -> FilledBundle:
        return build_trtllm_bundle(cfg, tmp, log)


def build_trtllm_bundle(cfg: BuildConfig, tmp_dir: str | Path, log: Log = print) -> FilledBundle:
    """Fill `tmp_dir` with the trtllm bundle files (engines, plugin, draft graphs, dflash_engine.json)."""
    for module in ("tensorrt_llm", "tensorrt", "onnx"):
        versions.require(module, PURPOSE)
    versions.require_engine_route(PURPOSE)
    from dflash_trt.backends.trtllm import build_steps

    tmp_dir = Path(tmp_dir)
    plan = plan_trtllm_build(cfg, tmp_dir)
    log(describe_reserved(reserved_bytes(plan, cfg.runtime))
        + ("" if plan.sampled else "; greedy requests only (runtime.sampled_requests: false)"))
    build_steps.check_gpu(cfg)
    try:
        library = build_steps.copy_plugin(tmp_dir, log)
        build_steps.convert_checkpoint(cfg, plan, log)
        build_steps.build_target(cfg, plan, tmp_dir, log)
        build_steps.build_draft(cfg, plan, tmp_dir, log)
        write_engine_config(tmp_dir, plan, library)
    finally:
        shutil.rmtree(plan.checkpoint_dir, ignore_errors=True)
    return FilledBundle(pair_info(plan) | {"format": "trtllm-engines"}, installed_versions())
