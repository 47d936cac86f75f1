"""What the trtllm backend generates, checked against TensorRT-LLM 1.2.1's / TensorRT's documented schema.

Schema facts are encoded below from the upstream files they come from:
- trtllm-build flags: NVIDIA/TensorRT-LLM tensorrt_llm/commands/build.py@65f1d15 `parse_arguments`
  and `main` (--model_cls_file needs --model_cls_name; --gather_context_logits with --max_draft_len > 0
  is rejected), plugin flags from tensorrt_llm/plugin/plugin.py@c20322f `PluginConfig`,
  `cli_plugin_args`, `add_plugin_argument` (bool features take enable/disable).
- the model class file is loaded as `SourceFileLoader('models', path).load_module()` then
  `getattr(module, model_cls_name)` (build.py `main`).
- additional outputs need a dynamic first dimension (executor `allocAdditionalOutputs`).
- the plugin: plugins/dflash_verify/tensorrt/dflash_verify_plugin.h (IPluginV3 "DFlashVerify" v1).
"""

import argparse
import json
import re
import sys
import warnings
from importlib.machinery import SourceFileLoader
from pathlib import Path

import pytest

from dflash_trt.backends.trtllm.build import build_trtllm_bundle, plan_trtllm_build, write_engine_config
from dflash_trt.backends.trtllm.io_spec import TargetOutputs
from dflash_trt.backends.trtllm.plugin import DFLASH_VERIFY
from dflash_trt.backends.trtllm.target_build import MODEL_CLS_FILE, engine_lengths, trtllm_build_args, write_model_class
from dflash_trt.engine.config import load_build_config
from dflash_trt.errors import ConfigError, MissingDependencyError, UnsupportedModelError

ROOT = Path(__file__).resolve().parent.parent
PLUGIN_DIR = ROOT / "plugins" / "dflash_verify" / "tensorrt"

# build.py@65f1d15 parse_arguments (flags we may emit, with their types / choices)
BUILD_FLAGS = {
    "checkpoint_dir": str, "output_dir": str, "model_cls_file": str, "model_cls_name": str, "workers": int,
    "max_batch_size": int, "max_input_len": int, "max_seq_len": int, "max_beam_width": int, "max_num_tokens": int,
    "opt_num_tokens": int, "max_draft_len": int,
    "kv_cache_type": ["continuous", "paged", "disabled"],  # enum_type(KVCacheType)
    "logits_dtype": ["float16", "float32"],
    "speculative_decoding_mode": ["draft_tokens_external", "lookahead_decoding", "medusa", "explicit_draft_tokens",
                                  "eagle"],
}
# plugin.py@c20322f: plugin dtypes (Optional[Literal[...]] -> choices, None as "disable"), bool features, ints
PLUGIN_DTYPE = ["auto", "float16", "float32", "bfloat16", "int32", "disable"]
PLUGIN_FLAGS = {
    "gpt_attention_plugin": PLUGIN_DTYPE, "bert_attention_plugin": PLUGIN_DTYPE, "nccl_plugin": PLUGIN_DTYPE,
    "gemm_plugin": ["auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"],
    "gemm_swiglu_plugin": ["fp8", "disable"], "low_latency_gemm_plugin": ["fp8", "disable"],
    "tokens_per_block": int,
    **{name: ["enable", "disable"] for name in (
        "context_fmha", "remove_input_padding", "use_paged_context_fmha", "use_fp8_context_fmha", "fuse_fp4_quant",
        "multiple_profiles", "paged_state", "norm_quant_fusion", "reduce_fusion", "use_fused_mlp")},
}


def upstream_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trtllm-build", add_help=False)
    for name, kind in {**BUILD_FLAGS, **PLUGIN_FLAGS}.items():
        if isinstance(kind, list):
            parser.add_argument(f"--{name}", choices=kind)
        else:
            parser.add_argument(f"--{name}", type=kind)
    return parser


def _config(tmp_path, tiny_pair, **fields) -> Path:
    values = {"name": "tiny-trtllm", "target": str(tiny_pair[0]), "draft": str(tiny_pair[1]), "backend": "trtllm",
              "runtime": {"device": "cuda", "max_batch_size": 4, "max_seq_len": 256}, **fields}
    path = tmp_path / "cfg.yaml"
    import yaml

    path.write_text(yaml.safe_dump(values))
    return path


@pytest.mark.parametrize("quant,kv_cache,gemm", [("none", "auto", "auto"), ("fp8", "fp8", "fp8"),
                                                 ("nvfp4", "auto", "nvfp4")])
def test_trtllm_build_args_parse_under_the_pinned_flags(tmp_path, quant, kv_cache, gemm):
    args = trtllm_build_args(tmp_path / "ckpt", tmp_path / "engine", "qwen3", quant, kv_cache, 8, 1024, 16)
    parsed = upstream_parser().parse_args(args)  # an unknown flag or a bad choice exits here
    assert parsed.gemm_plugin == gemm and parsed.kv_cache_type == "paged"
    assert parsed.use_paged_context_fmha == "enable"  # KV reuse: drafts travel in the prompt
    assert parsed.use_fp8_context_fmha == ("enable" if kv_cache == "fp8" else None)
    assert parsed.model_cls_file == str(tmp_path / "engine" / MODEL_CLS_FILE) and parsed.model_cls_name
    assert parsed.workers == 1 and parsed.max_beam_width == 1 and parsed.logits_dtype == "float32"
    assert parsed.speculative_decoding_mode is None and parsed.max_draft_len is None  # no draft_tokens_external
    assert "--gather_context_logits" not in args
    lengths = engine_lengths(1024, 16, 8)
    assert parsed.max_input_len == lengths["max_input_len"] >= 1024 + 16
    assert parsed.max_seq_len == parsed.max_input_len + 1 and parsed.max_num_tokens >= parsed.max_input_len


def test_plan_settings_and_args_for_a_pair(tmp_path, tiny_pair):
    cfg = load_build_config(_config(tmp_path, tiny_pair, quant="fp8", kv_cache="fp8"))
    plan = plan_trtllm_build(cfg, tmp_path / "bundle.tmp")
    draft_config = json.loads((tiny_pair[1] / "config.json").read_text())
    s = plan.settings
    assert s["target_layer_ids"] == draft_config["dflash_config"]["target_layer_ids"]
    assert s["num_drafts"] == plan.block_size - 1 == draft_config["block_size"] - 1
    assert s["mask_token_id"] == draft_config["dflash_config"]["mask_token_id"]
    assert s["plugin"] == {"name": "DFlashVerify", "version": "1", "namespace": ""}
    assert s["outputs"] == TargetOutputs(2, 64, 256, plan.block_size, "bf16", sampled=True).to_list()
    assert s["sampled"] is True  # runtime.sampled_requests defaults to true
    assert plan.draft_spec.capacity == 256 + plan.block_size + 1 and plan.dtype == "bf16"
    parsed = upstream_parser().parse_args(plan.build_args)
    assert parsed.checkpoint_dir == str(plan.checkpoint_dir / "target")
    assert parsed.output_dir == str(tmp_path / "bundle.tmp" / "target")
    assert parsed.model_cls_name == s["class_name"] == "DFlashQwen3ForCausalLM"


def test_model_class_file_loads_like_trtllm_build_and_names_the_missing_package(tmp_path, tiny_pair, monkeypatch):
    plan = plan_trtllm_build(load_build_config(_config(tmp_path, tiny_pair)), tmp_path / "b")
    path = write_model_class(tmp_path / "engine", plan.settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = SourceFileLoader("models", str(path)).load_module()  # exactly build.py main()'s call
    assert module.load_settings() == plan.settings
    assert set(module.BASES) == {"DFlashQwen3ForCausalLM", "DFlashLlamaForCausalLM"}
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    with pytest.raises(ImportError, match=r"tensorrt-llm==1\.2\.1"):
        getattr(module, plan.settings["class_name"])
    source = path.read_text()
    assert "add_plugin_v3" in source and "TensorRTPhase.BUILD" in source and "load_library" in source
    for name in ("dflash_taps", "dflash_accept", "dflash_tail_logits"):
        assert f'"{name}"' in source
    assert 'if s.get("sampled")' in source  # the block logits are marked only in engines for sampled requests


def test_engine_config_json_schema(tmp_path, tiny_pair):
    plan = plan_trtllm_build(load_build_config(_config(tmp_path, tiny_pair)), tmp_path / "b")
    written = write_engine_config(tmp_path, plan, Path("/opt/libdflash_verify_trt.so"))
    config = json.loads((tmp_path / "dflash_engine.json").read_text())
    assert config == json.loads(json.dumps(written))
    assert config["format"] == "dflash-trt/trtllm-engines" and config["num_drafts"] == plan.block_size - 1
    assert config["target"]["trtllm_build_argv"][0] == "trtllm-build"
    outputs = config["target"]["extra_outputs"]
    assert [o["name"] for o in outputs] == ["dflash_taps", "dflash_accept", "dflash_tail_logits"]
    assert all(isinstance(o["dims"][0], str) for o in outputs)  # executor: first dim must be dynamic
    assert [o["gather_context"] for o in outputs] == [True, False, False]
    assert outputs[1] == {"name": "dflash_accept", "dtype": "int32", "dims": ["num_requests", plan.block_size + 2],
                          "gather_context": False}
    assert config["plugin"]["name"] == "DFlashVerify" and config["plugin"]["library"] == "plugin/libdflash_verify_trt.so"
    assert set(config["versions"]) >= {"tensorrt_llm", "tensorrt", "torch"}


def test_greedy_engines_register_no_block_logits(tmp_path, tiny_pair):
    cfg = load_build_config(_config(tmp_path, tiny_pair, runtime={"device": "cuda", "max_batch_size": 4,
                                                                  "max_seq_len": 256, "sampled_requests": False}))
    plan = plan_trtllm_build(cfg, tmp_path / "b")
    assert [o["name"] for o in plan.settings["outputs"]] == ["dflash_taps", "dflash_accept"]
    assert plan.settings["sampled"] is False


# Qwen3-8B (HF config.json: hidden_size 4096, vocab_size 151936) + z-lab/Qwen3-8B-DFlash-b16 (block_size 16,
# target_layer_ids [1, 9, 17, 25, 33]): the dims of the hopper preset's pair, which is not downloaded here
QWEN3_8B = dict(n_taps=5, hidden_size=4096, vocab_size=151936, block_size=16, dtype="bf16")


def test_additional_outputs_of_the_qwen3_preset_reserve_under_2_gb_for_greedy_serving():
    """RuntimeBuffers allocates every registered additional output [max_num_tokens, X] (TensorRT-LLM
    cpp/tensorrt_llm/batch_manager/runtimeBuffers.cpp@2a9abd9) before the KV cache is sized
    (trtGptModelInflightBatching.cpp@b35ac1b): greedy serving must stay small, sampled costs tens of GB."""
    from dflash_trt.backends.trtllm.io_spec import describe_reserved

    cfg = load_build_config(ROOT / "build_configs" / "qwen3-8b-fp8-hopper.yaml")
    tokens = engine_lengths(cfg.runtime.max_seq_len, cfg.block_size, cfg.runtime.max_batch_size)["max_num_tokens"]
    assert tokens == cfg.runtime.max_seq_len + cfg.block_size + 1  # one whole prompt per step, no chunking
    greedy = TargetOutputs(**QWEN3_8B, sampled=False).reserved_bytes(tokens)
    assert sum(greedy.values()) < 2e9, describe_reserved(greedy)
    assert greedy["dflash_taps"] == 2 * tokens * 5 * 4096 * 2  # two buffer sets x [max_num_tokens, n*H] bf16
    sampled = TargetOutputs(**QWEN3_8B, sampled=True).reserved_bytes(tokens)
    assert sampled["dflash_tail_logits"] == 2 * tokens * 16 * 151936 * 4 > 70e9  # why it is opt-in
    assert cfg.runtime.sampled_requests is False  # the preset serves greedy requests
    assert "additional outputs reserve 0.34 GB" in describe_reserved(greedy)


def test_draft_engine_profiles_cover_the_runtime_limits(tmp_path, tiny_pair):
    spec = plan_trtllm_build(load_build_config(_config(tmp_path, tiny_pair)), tmp_path / "b").draft_spec
    for graph, io in (("context", spec.context_io()), ("propose", spec.propose_io())):
        profile = spec.profile(graph)
        assert list(profile) == [t.name for t in io[0]]
        for name, (low, opt, high) in profile.items():
            assert len(low) == len(opt) == len(high)
            assert all(1 <= a <= b <= c for a, b, c in zip(low, opt, high)), name
    assert spec.profile("propose")["context_k"][2] == (spec.num_layers, 4, spec.num_kv_heads, spec.capacity,
                                                       spec.head_dim)
    assert spec.profile("context")["target_hidden"][2][0] >= spec.capacity


def test_plugin_metadata_matches_the_plugin_header():
    header = PLUGIN_DIR / "dflash_verify_plugin.h"
    if not header.is_file():
        pytest.skip(f"{header} not present")
    text = header.read_text()
    assert re.search(r'kPluginName\[\]\s*=\s*"(\w+)"', text).group(1) == DFLASH_VERIFY.name
    assert re.search(r'kPluginVersion\[\]\s*=\s*"(\w+)"', text).group(1) == DFLASH_VERIFY.version
    assert int(re.search(r"kNbInputs\s*=\s*(\d+)", text).group(1)) == len(DFLASH_VERIFY.inputs)
    assert int(re.search(r"kNbOutputs\s*=\s*(\d+)", text).group(1)) == len(DFLASH_VERIFY.outputs)
    listed = [re.findall(r"\b(\d) (\w+)\s+\[", line) for line in text.splitlines() if line.startswith("//")]
    inputs = [m[0][1] for m in listed if m]
    outputs = [m[1][1] for m in listed if len(m) > 1]
    assert inputs == [name for name, _ in DFLASH_VERIFY.inputs]
    assert outputs == [name for name, _ in DFLASH_VERIFY.outputs]
    source = (PLUGIN_DIR / "dflash_verify_plugin.cpp").read_text()
    assert '"mask_token_id"' in source and "kINT64" in source and "getCreators" in source


def test_config_errors_name_the_field(tmp_path, tiny_pair):
    with pytest.raises(ConfigError, match="'tp'"):
        plan_trtllm_build(load_build_config(_config(tmp_path, tiny_pair, tp=2)), tmp_path / "b")
    with pytest.raises(ConfigError, match="'dtype'"):
        plan_trtllm_build(load_build_config(_config(tmp_path, tiny_pair, quant="fp8", dtype="fp32")), tmp_path / "b")
    with pytest.raises(ConfigError, match="'block_size'"):
        plan_trtllm_build(load_build_config(_config(tmp_path, tiny_pair, block_size=64)), tmp_path / "b")
    # tensorrt_llm/builder.py (build()) turns paged context FMHA off for FP8 KV without FP8 / NVFP4 weights
    with pytest.raises(ConfigError, match="'kv_cache': fp8 with quant: none"):
        plan_trtllm_build(load_build_config(_config(tmp_path, tiny_pair, kv_cache="fp8")), tmp_path / "b")
    for quant in ("fp8", "nvfp4"):
        plan_trtllm_build(load_build_config(_config(tmp_path, tiny_pair, quant=quant, kv_cache="fp8")), tmp_path / "b")


def test_unsupported_target_points_to_the_llmapi_export(tmp_path, tiny_pair):
    target = tmp_path / "gpt-oss"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["GptOssForCausalLM"], "vocab_size": 256}))
    with pytest.raises(UnsupportedModelError, match="export trtllm-llmapi"):
        plan_trtllm_build(load_build_config(_config(tmp_path, tiny_pair, target=str(target))), tmp_path / "b")


def test_build_without_tensorrt_llm_names_the_pinned_package(tmp_path, tiny_pair, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    cfg = load_build_config(_config(tmp_path, tiny_pair))
    with pytest.raises(MissingDependencyError, match=r"tensorrt_llm \(tensorrt-llm==1\.2\.1\).*pip install"):
        build_trtllm_bundle(cfg, tmp_path / "b")
    assert not (tmp_path / "b").exists()
