"""Route B: a Triton repository for TensorRT-LLM's own `llmapi` model with native DFlash.

    OUT/tensorrt_llm/config.pbtxt   Python-backend model "tensorrt_llm" (inputs text_input, streaming,
                                    sampling_param_*; outputs text_output, ..., acceptance stats)
    OUT/tensorrt_llm/1/model.yaml   LLM(**kwargs) arguments: backend pytorch, explicit max_seq_len,
                                    attn_backend TRTLLM, speculative_config {decoding_type: DFlash,
                                    max_draft_len: block_size - 1, speculative_model, attention_backend}
    OUT/tensorrt_llm/1/model.py, helpers.py   NVIDIA's files, copied from --llmapi-dir (they must match
                                    the TensorRT-LLM the server runs); otherwise README.txt says where

Schema (TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm): model.py's
`auto_complete_config` reads `triton_config.{decoupled, max_batch_size}` from model.yaml and
`initialize` passes every other key to `LLM(**update_llm_args_with_extra_dict({}, yaml))`.
DFlashDecodingConfig needs TensorRT-LLM >= 1.3.0rc27 (not 1.2.1); docs/trtllm-backend.md, route B.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from dflash_trt.atomic import repository_scratch, write_atomically
from dflash_trt.backends.trtllm import llmapi_fields
from dflash_trt.backends.trtllm.versions import TRTLLM_LLMAPI_MIN
from dflash_trt.engine.config import BuildConfig
from dflash_trt.errors import ConfigError, UnsupportedModelError

MODEL_NAME = "tensorrt_llm"
TRTLLM_ATTENTION_ARCHS = ("sm100", "sm103")  # DFlash attention_backend TRTLLM: FlashInfer trtllm-gen kernels
GPU_ARCHS = ("sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm120", "sm121")
NVIDIA_FILES = ("1/model.py", "1/helpers.py")
# name, data_type, dims, optional (config.pbtxt of the llmapi model)
INPUTS = [("text_input", "TYPE_STRING", [-1], False), ("streaming", "TYPE_BOOL", [1], True)] + [
    (f"sampling_param_{n}", t, d, True) for n, t, d in (
        ("best_of", "TYPE_INT32", [1]), ("temperature", "TYPE_FP32", [1]), ("top_k", "TYPE_INT32", [1]),
        ("top_p", "TYPE_FP32", [1]), ("frequency_penalty", "TYPE_FP32", [1]), ("presence_penalty", "TYPE_FP32", [1]),
        ("max_tokens", "TYPE_INT32", [1]), ("stop", "TYPE_STRING", [-1]), ("seed", "TYPE_UINT64", [1]),
        ("exclude_input_from_output", "TYPE_BOOL", [1]), ("return_perf_metrics", "TYPE_BOOL", [1]))
] + [(n, "TYPE_BOOL", [1], True) for n in ("return_finish_reason", "return_stop_reason",
                                            "return_cumulative_logprob", "stop")]
OUTPUTS = [("text_output", "TYPE_STRING", [-1]), ("finish_reason", "TYPE_STRING", [-1]),
           ("stop_reason", "TYPE_STRING", [-1]), ("cumulative_logprob", "TYPE_FP32", [-1])] + [
    (f"kv_cache_{n}", "TYPE_INT32", [-1]) for n in ("reused_block", "missed_block", "alloc_new_blocks",
                                                   "alloc_total_blocks")] + [
    ("kv_cache_hit_rate", "TYPE_FP32", [-1])] + [
    (f"{n}_time_ns", "TYPE_INT64", [1]) for n in ("arrival", "first_scheduled", "first_token", "last_token")] + [
    ("acceptance_rate", "TYPE_FP32", [1]), ("total_accepted_draft_tokens", "TYPE_INT32", [1]),
    ("total_draft_tokens", "TYPE_INT32", [1])]


@dataclass(frozen=True)
class LlmapiExport:
    target: str  # local folder (absolute) or Hugging Face id
    draft: str
    block_size: int  # verify width; max_draft_len = block_size - 1
    max_seq_len: int
    max_batch_size: int
    gpu_arch: str
    tp: int = 1  # tensor_parallel_size
    kv_cache: str = "auto"  # auto | fp8
    free_gpu_memory_fraction: float = 0.85
    block_size_schedule: tuple[tuple[int, int], ...] = ()  # (batch size, block size): runtime.block_size_schedule
    pp: int = 1  # pipeline_parallel_size
    ep: int | None = None  # moe_expert_parallel_size (MoE targets); None: TensorRT-LLM's default
    trtllm_version: str = llmapi_fields.PIN  # the release the server runs: which fields model.yaml may carry
    kv_block_reuse: bool = False  # TensorRT-LLM's prefix cache: the target's K/V only (REUSED_PREFIX_COST)

    def __post_init__(self):
        llmapi_fields.check_release(self.trtllm_version)
        if self.tp < 1 or self.pp < 1:
            raise ConfigError(f"--tp {self.tp} / --pp {self.pp}: both must be >= 1")
        if self.ep is not None and (self.ep < 1 or self.tp % self.ep):
            raise ConfigError(f"--ep {self.ep}: expert parallelism splits the tensor-parallel ranks (TensorRT-LLM "
                              f"moe_tensor_parallel_size x moe_expert_parallel_size = tensor_parallel_size); it must "
                              f"divide --tp {self.tp}")
        if self.gpu_arch not in GPU_ARCHS:
            raise ConfigError(f"--gpu-arch {self.gpu_arch!r}: expected one of {', '.join(GPU_ARCHS)}")
        if self.block_size < 2:
            raise ConfigError(f"--block-size {self.block_size}: must be >= 2 (max_draft_len = block_size - 1)")
        refuse_dflash2(self.draft, "route B")


def attention_backend(gpu_arch: str) -> str:
    """DFlash's draft attention: TRTLLM on SM100 / SM103 (Blackwell datacenter), else VANILLA (flash_attn)."""
    return "TRTLLM" if gpu_arch in TRTLLM_ATTENTION_ARCHS else "VANILLA"


def cuda_graph_batch_sizes(max_batch_size: int) -> list[int]:
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size]
    return sizes if sizes[-1] == max_batch_size else sizes + [max_batch_size]


def draft_len_schedule(e: LlmapiExport) -> dict[int, int]:
    """runtime.block_size_schedule (lower bounds: "from this batch size on, verify blocks of N") as
    TensorRT-LLM's DecodingBaseConfig.draft_len_schedule (UPPER bounds: {4: 4, 8: 2, 32: 1} is batch 1-4 -> 4,
    5-8 -> 2, 9-32 -> 1, above the largest key 0 = no speculation; the smallest key must map to
    max_draft_len; tensorrt_llm/llmapi/llm_args.py `validate_draft_len_schedule_and_sort`, upper-bound
    keys since v1.3.0rc8 (PR #10860), every release with DFlash). The last key is max_batch_size, so no
    batch the server runs falls off the end. Block 16, {4: 8, 8: 4}, max batch 8 -> {3: 15, 7: 7, 8: 3}."""
    steps = sorted((b, min(block, e.block_size) - 1) for b, block in e.block_size_schedule if b <= e.max_batch_size)
    if steps and steps[0][0] == 1 and steps[0][1] != e.block_size - 1:
        raise ConfigError(f"runtime.block_size_schedule {{1: {steps[0][1] + 1}}}: TensorRT-LLM requires the smallest "
                          f"batch sizes to draft max_draft_len = block_size - 1 = {e.block_size - 1}; set block_size to "
                          f"{steps[0][1] + 1} instead")
    ranges = [(1, e.block_size - 1)] + [s for s in steps if s[0] > 1]  # (first batch size, drafts)
    schedule: dict[int, int] = {}
    for (first, drafts), following in zip(ranges, [*ranges[1:], (e.max_batch_size + 1, None)]):
        last = following[0] - 1  # this range's largest batch size: an upper-bound key
        if schedule and list(schedule.values())[-1] == drafts:
            schedule.pop(list(schedule)[-1])  # same draft length as the range before: one key covers both
        schedule[last] = drafts
    return schedule


# What a prefix-cache hit costs under TensorRT-LLM's native DFlash, read from its source
# (tensorrt_llm/_torch/speculative/dflash.py@00679c6, DFlashWorker._store_prefill_context): the drafter's context
# is built from the hidden states of the tokens a forward computes, and a new request's first context chunk opens
# its context at length 0 whatever its first position. A reused prefix never passes through the target, so its
# context holds only the recomputed tail: outputs stay the target's, acceptance falls on every hit
# (NVIDIA/TensorRT-LLM#16005: "not able to retrieve the context on a prefix-cache hit").
REUSED_PREFIX_COST = (
    "KV block reuse (TensorRT-LLM's prefix cache) is {state}. With it on, a request whose prompt starts with cached "
    "blocks skips their prefill for the target, but TensorRT-LLM's DFlash drafter then reads a context without "
    "those positions (its context is built only from tokens a forward computes: tensorrt_llm/_torch/speculative/"
    "dflash.py, _store_prefill_context): outputs stay exact, acceptance and speed-up fall on every cache hit, the "
    "more the longer the shared prefix. dflash-trt's own engine keeps the drafter's context per cached block "
    "(docs/serving.md, prefix cache).")


# How TensorRT-LLM's DFlash drafter attends, read from its source (tensorrt_llm/_torch/models/modeling_dflash.py,
# DFlashForCausalLM._get_attention_mask_args): a sliding_attention layer runs causal with its window on the left
# only, (sliding_window - 1, 0); the checkpoint's `is_causal` is read for DFlash 2 drafters alone. A DFlashDraftModel
# trained non-causal over its window (z-lab's sliding drafters, ours from `train-draft --sliding-window`) then
# drafts from a mask it never trained with.
WINDOWED_DRAFTER_COST = (
    "{path}: the drafter's context attention is windowed ({window} positions) and not causal inside its block "
    "(`is_causal: false`); TensorRT-LLM's DFlash runs a DFlashDraftModel's sliding layers causal (tensorrt_llm/"
    "_torch/models/modeling_dflash.py, _get_attention_mask_args: `is_causal` is read for DFlash 2 drafters only), "
    "so each block's drafts see only the slots before them there: outputs stay exact, acceptance falls against "
    "what `dflash-trt bench` measures on the torch and CPU backends, which honour the checkpoint.")


def windowed_drafter_cost(draft: str | Path) -> str | None:
    """WINDOWED_DRAFTER_COST for a drafter whose local config.json has non-causal sliding_attention layers."""
    path = Path(draft) / "config.json"
    try:
        config = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return None  # the route's own reader reports a broken config
    sliding = "sliding_attention" in (config.get("layer_types") or [])
    if not sliding or config.get("is_causal", True) or config.get("use_sliding_window") is False:
        return None
    return WINDOWED_DRAFTER_COST.format(path=path, window=config.get("sliding_window"))


def model_yaml(e: LlmapiExport) -> dict:
    """The llmapi model.yaml: LLM() keyword arguments plus `triton_config`."""
    kv_cache = {"free_gpu_memory_fraction": e.free_gpu_memory_fraction, "enable_block_reuse": e.kv_block_reuse}
    if e.kv_cache == "fp8":
        kv_cache["dtype"] = "fp8"
    return {
        "model": e.target,
        "backend": "pytorch",
        "tensor_parallel_size": e.tp,
        "pipeline_parallel_size": e.pp,
        **({"moe_expert_parallel_size": e.ep} if e.ep is not None else {}),
        "max_batch_size": e.max_batch_size,
        "max_seq_len": e.max_seq_len,  # explicit: it bounds DFlash's dense context arena
        "max_num_tokens": max(e.max_seq_len, e.max_batch_size * e.block_size),
        "attn_backend": "TRTLLM",  # DFlash with FlashInfer target attention is refused
        "kv_cache_config": kv_cache,
        "cuda_graph_config": {"batch_sizes": cuda_graph_batch_sizes(e.max_batch_size), "enable_padding": True},
        "speculative_config": speculative_config(e),
        "triton_config": {"max_batch_size": 0, "decoupled": True},
    }


def speculative_config(e: LlmapiExport) -> dict:
    """DFlashDecodingConfig keyword arguments, only those `e.trtllm_version` declares (llmapi_fields)."""
    allowed = llmapi_fields.fields(e.trtllm_version)
    config = {"decoding_type": "DFlash", "max_draft_len": e.block_size - 1, "speculative_model": e.draft,
              "attention_backend": attention_backend(e.gpu_arch)}
    if e.block_size_schedule:
        config["draft_len_schedule"] = draft_len_schedule(e)
    return {k: v for k, v in config.items() if k in allowed}


def model_yaml_text(e: LlmapiExport) -> str:
    """model.yaml with a header saying which release its fields are for."""
    fields = sorted(speculative_config(e))
    return (f"# written by dflash-trt export trtllm-llmapi for TensorRT-LLM {e.trtllm_version} "
            f"(speculative_config fields: {', '.join(fields)}); re-export with --trtllm-version for another release\n"
            + yaml.safe_dump(model_yaml(e), sort_keys=False))


def config_pbtxt() -> str:
    def block(kind: str, specs) -> str:
        entries = []
        for name, dtype, dims, *optional in specs:
            extra = "\n    optional: true" if optional and optional[0] else ""
            entries.append(f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: {dims}{extra}\n  }}')
        return f"{kind} [\n" + ",\n".join(entries) + "\n]\n"

    return (f'# TensorRT-LLM llmapi model (written by dflash-trt export trtllm-llmapi; needs tensorrt-llm>='
            f'{TRTLLM_LLMAPI_MIN}).\n# max_batch_size and decoupled come from 1/model.yaml triton_config.\n'
            f'name: "{MODEL_NAME}"\nbackend: "python"\n'
            "instance_group [\n  {\n    count: 1\n    kind: KIND_CPU\n  }\n]\n"
            + block("input", INPUTS) + block("output", OUTPUTS))


def refuse_dflash2(draft, route: str) -> None:
    """TensorRT-LLM's DFlash (decoding_type DFlash) runs DFlashDraftModel drafters only, and our paired
    engines have no DFlash2 graphs: a DFlash2 drafter (local config.json) is refused with where it runs."""
    path = Path(draft) / "config.json"
    try:
        archs = json.loads(path.read_text()).get("architectures") or [] if path.is_file() else []
    except (OSError, ValueError):
        return  # the route's own reader reports a broken config
    if "DFlash2DraftModel" in archs:
        what = ("TensorRT-LLM has no DFlash2 (its DFlash decoding runs DFlashDraftModel drafters only)"
                if route == "route B" else "the paired TensorRT-LLM engines have no DFlash2 graphs yet "
                "(convolutions and the candidate selector)")
        raise UnsupportedModelError(f"{path}: field 'architectures': DFlash2DraftModel: {what}; serve it with "
                                    "backend: torch (CPU or CUDA), which runs DFlash2")


def draft_block_size(draft: str) -> int | None:
    """The drafter's trained block size from a local config.json (dflash_config first, as z-lab reads it)."""
    path = Path(draft) / "config.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    value = (data.get("dflash_config") or {}).get("block_size", data.get("block_size"))
    return int(value) if value is not None else None


def check_quantized_target(target: str, quant: str) -> None:
    """FP8 / NVFP4 on the PyTorch backend means a pre-quantized HF checkpoint; say so if it is not."""
    folder = Path(target)
    if quant == "none" or not (folder / "config.json").is_file():
        return
    config = json.loads((folder / "config.json").read_text())
    if not (folder / "hf_quant_config.json").is_file() and "quantization_config" not in config:
        raise ConfigError(
            f"{folder}: quant '{quant}' asks for a quantized target, but this folder is unquantized (no "
            "hf_quant_config.json, no quantization_config); TensorRT-LLM's PyTorch backend loads pre-quantized "
            "HF checkpoints: point --target at one (e.g. a ModelOpt unified-HF export, or nvidia/*-FP8 / *-FP4)")


def write_repository(e: LlmapiExport, out: str | Path, llmapi_dir: str | Path | None = None) -> Path:
    """Write OUT/tensorrt_llm atomically; returns the model folder."""
    out = Path(out)

    def fill(tmp: Path) -> None:
        (tmp / "1").mkdir()
        (tmp / "1" / "model.yaml").write_text(model_yaml_text(e))
        if llmapi_dir is None:
            (tmp / "config.pbtxt").write_text(config_pbtxt())
            (tmp / "1" / "README.txt").write_text(
                "Copy model.py and helpers.py from triton_backend/all_models/llmapi/tensorrt_llm/1/ of the "
                f"TensorRT-LLM release the server runs (>= {TRTLLM_LLMAPI_MIN}) into this folder, or re-run "
                "dflash-trt export trtllm-llmapi with --llmapi-dir.\n")
            return
        source = Path(llmapi_dir)
        for rel in ("config.pbtxt", *NVIDIA_FILES):
            if not (source / rel).is_file():
                raise ConfigError(f"--llmapi-dir {source}: no {rel}; expected TensorRT-LLM's "
                                  "triton_backend/all_models/llmapi/tensorrt_llm folder")
            shutil.copy2(source / rel, tmp / rel)

    out.mkdir(parents=True, exist_ok=True)
    return write_atomically(out / MODEL_NAME, fill, owned=lambda f: (f / "1" / "model.yaml").is_file(),
                            scratch=repository_scratch(out), what="llmapi model folder")


def from_build_config(cfg: BuildConfig, gpu_arch: str, **overrides) -> LlmapiExport:
    """An export from a build config (`target` / `draft` resolved like `dflash-trt build` does)."""
    target = overrides.pop("target", None) or str(cfg.target_path())
    draft = overrides.pop("draft", None) or str(cfg.draft_path())
    trained = draft_block_size(draft)
    block_size = overrides.pop("block_size", None) or cfg.block_size or trained
    if block_size is None:
        raise ConfigError(f"{cfg.source}: no block_size and no drafter config.json at {draft}; pass --block-size")
    if trained is not None and block_size > trained:
        raise ConfigError(f"{cfg.source}: block_size {block_size} exceeds the drafter's trained {trained} "
                          "(TensorRT-LLM requires max_draft_len + 1 <= block_size)")
    check_quantized_target(target, cfg.quant)
    values = dict(target=target, draft=draft, block_size=block_size,
                  max_seq_len=cfg.runtime.max_seq_len, max_batch_size=cfg.runtime.max_batch_size, gpu_arch=gpu_arch,
                  tp=cfg.tp, kv_cache=cfg.kv_cache if cfg.kv_cache == "fp8" else "auto",
                  trtllm_version=llmapi_fields.default_version(installed_llmapi_version()),
                  block_size_schedule=tuple(sorted((int(b), int(k)) for b, k in
                                                   cfg.runtime.block_size_schedule.items())))
    values.update({k: v for k, v in overrides.items() if v is not None})
    return LlmapiExport(**values)


def installed_llmapi_version() -> str | None:
    from dflash_trt.backends.trtllm.versions import installed_version

    return installed_version("tensorrt_llm")


def detect_gpu_arch() -> str:
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"--gpu-arch auto: no CUDA GPU is visible here; pass the server's: {', '.join(GPU_ARCHS)}")
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"
