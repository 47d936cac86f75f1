"""`dflash-trt export trtllm-llmapi`: model.yaml and config.pbtxt against TensorRT-LLM's llmapi model schema.

Schema facts, from NVIDIA/TensorRT-LLM triton_backend/all_models/llmapi/tensorrt_llm:
- config.pbtxt@0a71057: name "tensorrt_llm", backend "python", one KIND_CPU instance; max_batch_size and
  the transaction policy are NOT in config.pbtxt ("specific in model.yaml"); the inputs / outputs below.
- 1/model.py@044a90d: `auto_complete_config` reads model.yaml `triton_config["decoupled"]` and
  `["max_batch_size"]`; `initialize` passes every other key to `LLM(**update_llm_args_with_extra_dict({}, cfg))`.
- DFlashDecodingConfig (API reference, TensorRT-LLM 1.3.0rc27): the field names below; decoding_type
  "DFlash"; attention_backend VANILLA | TRTLLM; max_draft_len + 1 <= the drafter's block_size.
"""

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from dflash_trt.backends.trtllm.llmapi import (
    LlmapiExport,
    attention_backend,
    config_pbtxt,
    draft_len_schedule,
    model_yaml,
)
from dflash_trt.cli import cli

ROOT = Path(__file__).resolve().parent.parent
DFLASH_FIELDS = {"max_draft_len", "max_total_draft_tokens", "speculative_model", "max_concurrency",
                 "draft_len_schedule", "load_format", "acceptance_rate_window_size", "acceptance_rate_threshold",
                 "use_rejection_sampling", "allow_advanced_sampling", "advanced_sampling_mode", "enable_penalty",
                 "mask_token_id", "target_layer_ids", "decoding_type", "attention_backend"}
UPSTREAM_INPUTS = {  # name: (data_type, dims, optional)
    "text_input": ("TYPE_STRING", [-1], False), "streaming": ("TYPE_BOOL", [1], True),
    "sampling_param_best_of": ("TYPE_INT32", [1], True), "sampling_param_temperature": ("TYPE_FP32", [1], True),
    "sampling_param_top_k": ("TYPE_INT32", [1], True), "sampling_param_top_p": ("TYPE_FP32", [1], True),
    "sampling_param_frequency_penalty": ("TYPE_FP32", [1], True),
    "sampling_param_presence_penalty": ("TYPE_FP32", [1], True),
    "sampling_param_max_tokens": ("TYPE_INT32", [1], True), "sampling_param_stop": ("TYPE_STRING", [-1], True),
    "sampling_param_seed": ("TYPE_UINT64", [1], True),
    "sampling_param_exclude_input_from_output": ("TYPE_BOOL", [1], True),
    "sampling_param_return_perf_metrics": ("TYPE_BOOL", [1], True),
    "return_finish_reason": ("TYPE_BOOL", [1], True), "return_stop_reason": ("TYPE_BOOL", [1], True),
    "return_cumulative_logprob": ("TYPE_BOOL", [1], True), "stop": ("TYPE_BOOL", [1], True),
}
UPSTREAM_OUTPUTS = {
    "text_output": ("TYPE_STRING", [-1]), "finish_reason": ("TYPE_STRING", [-1]), "stop_reason": ("TYPE_STRING", [-1]),
    "cumulative_logprob": ("TYPE_FP32", [-1]), "kv_cache_reused_block": ("TYPE_INT32", [-1]),
    "kv_cache_missed_block": ("TYPE_INT32", [-1]), "kv_cache_alloc_new_blocks": ("TYPE_INT32", [-1]),
    "kv_cache_alloc_total_blocks": ("TYPE_INT32", [-1]), "kv_cache_hit_rate": ("TYPE_FP32", [-1]),
    "arrival_time_ns": ("TYPE_INT64", [1]), "first_scheduled_time_ns": ("TYPE_INT64", [1]),
    "first_token_time_ns": ("TYPE_INT64", [1]), "last_token_time_ns": ("TYPE_INT64", [1]),
    "acceptance_rate": ("TYPE_FP32", [1]), "total_accepted_draft_tokens": ("TYPE_INT32", [1]),
    "total_draft_tokens": ("TYPE_INT32", [1]),
}


def parse_tensors(text: str, kind: str) -> dict:
    body = re.search(rf"^{kind} \[(.*?)^\]", text, re.S | re.M).group(1)
    out = {}
    for entry in re.findall(r"\{(.*?)\}", body, re.S):
        name = re.search(r'name: "(\w+)"', entry).group(1)
        dims = json.loads(re.search(r"dims: (\[[^\]]*\])", entry).group(1))
        out[name] = (re.search(r"data_type: (\w+)", entry).group(1), dims, "optional: true" in entry)
    return out


def _export(**kw) -> LlmapiExport:
    values = dict(target="/models/Qwen3-8B", draft="/models/Qwen3-8B-DFlash-b16", block_size=16, max_seq_len=4096,
                  max_batch_size=8, gpu_arch="sm90")
    return LlmapiExport(**{**values, **kw})


def test_config_pbtxt_matches_the_llmapi_model():
    text = config_pbtxt()
    assert re.search(r'^name: "tensorrt_llm"$', text, re.M) and re.search(r'^backend: "python"$', text, re.M)
    assert "kind: KIND_CPU" in text and "count: 1" in text
    assert not re.search(r"^\s*max_batch_size:", text, re.M) and "model_transaction_policy" not in text
    assert parse_tensors(text, "input") == UPSTREAM_INPUTS
    outputs = {name: spec[:2] for name, spec in parse_tensors(text, "output").items()}
    assert outputs == UPSTREAM_OUTPUTS


@pytest.mark.parametrize("arch,backend", [("sm90", "VANILLA"), ("sm100", "TRTLLM"), ("sm103", "TRTLLM"),
                                          ("sm120", "VANILLA"), ("sm89", "VANILLA")])
def test_model_yaml_dflash_config(arch, backend):
    cfg = model_yaml(_export(gpu_arch=arch, kv_cache="fp8", block_size_schedule=((4, 8), (8, 4))))
    spec = cfg["speculative_config"]
    assert set(spec) <= DFLASH_FIELDS and spec["decoding_type"] == "DFlash"
    assert spec["max_draft_len"] == 15 and spec["speculative_model"] == "/models/Qwen3-8B-DFlash-b16"
    # DecodingBaseConfig.draft_len_schedule: upper-bound keys, the smallest one maps to max_draft_len
    assert spec["draft_len_schedule"] == {3: 15, 7: 7, 8: 3}
    assert spec["attention_backend"] == backend == attention_backend(arch)
    assert cfg["backend"] == "pytorch" and cfg["max_seq_len"] == 4096 and cfg["attn_backend"] == "TRTLLM"
    assert cfg["triton_config"] == {"max_batch_size": 0, "decoupled": True}
    assert cfg["kv_cache_config"]["dtype"] == "fp8"
    assert cfg["cuda_graph_config"]["batch_sizes"] == [1, 2, 4, 8]
    assert yaml.safe_load(yaml.safe_dump(cfg)) == cfg


def test_export_from_the_hopper_preset(tmp_path):
    result = CliRunner().invoke(cli, ["export", "trtllm-llmapi", "--config", str(ROOT / "build_configs" / "qwen3-8b-fp8-hopper.yaml"),
                                      "--out", str(tmp_path), "--gpu-arch", "sm90"])
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load((tmp_path / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert cfg["model"] == str(ROOT / "models" / "Qwen3-8B")
    assert cfg["speculative_config"]["max_draft_len"] == 15 and cfg["max_seq_len"] == 4096
    assert (tmp_path / "tensorrt_llm" / "config.pbtxt").read_text() == config_pbtxt()
    assert "model.py" in (tmp_path / "tensorrt_llm" / "1" / "README.txt").read_text()


def test_block_reuse_is_off_unless_asked_and_the_export_says_what_a_hit_costs(tmp_path):
    base = ["export", "trtllm-llmapi", "--config", str(ROOT / "build_configs" / "qwen3-8b-fp8-hopper.yaml"),
            "--gpu-arch", "sm90"]
    for flag, reuse in ((None, False), ("--kv-block-reuse", True)):
        out = tmp_path / str(reuse)
        result = CliRunner().invoke(cli, base + ["--out", str(out)] + ([flag] if flag else []))
        assert result.exit_code == 0, result.output
        cfg = yaml.safe_load((out / "tensorrt_llm" / "1" / "model.yaml").read_text())
        assert cfg["kv_cache_config"]["enable_block_reuse"] is reuse
        said = " ".join(result.output.split())
        assert f"KV block reuse (TensorRT-LLM's prefix cache) is {'on' if reuse else 'off'}" in said
        assert "acceptance and speed-up fall on every cache hit" in said and "_store_prefill_context" in said


def test_the_export_says_what_a_non_causal_windowed_drafter_costs_there(tmp_path):
    """The shipped drafter (sliding_attention, is_causal false) runs causal under TensorRT-LLM's DFlash: said; a
    causal or full-attention drafter: nothing said."""
    from dflash_trt.engine.config import ASSETS

    shipped = ASSETS / "tiny-qwen3-dflash"
    base = ["export", "trtllm-llmapi", "--target", str(ASSETS / "tiny-qwen3"), "--gpu-arch", "sm90"]
    result = CliRunner().invoke(cli, base + ["--draft", str(shipped), "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "windowed (256 positions) and not causal" in said and "_get_attention_mask_args" in said
    config = json.loads((shipped / "config.json").read_text())
    for change in ({"is_causal": True}, {"layer_types": ["full_attention"] * 2}):
        other = tmp_path / f"draft{len(change)}{next(iter(change))}"
        shutil.copytree(shipped, other)
        (other / "config.json").write_text(json.dumps(config | change))
        result = CliRunner().invoke(cli, base + ["--draft", str(other), "--out", str(tmp_path / other.name)])
        assert result.exit_code == 0 and "not causal" not in result.output, result.output


def test_export_reads_the_block_size_and_copies_nvidia_files(tmp_path, tiny_pair):
    llmapi = tmp_path / "llmapi"
    (llmapi / "1").mkdir(parents=True)
    for rel in ("config.pbtxt", "1/model.py", "1/helpers.py"):
        (llmapi / rel).write_text(f"# {rel}\n")
    out = tmp_path / "repo"
    args = ["export", "trtllm-llmapi", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--out", str(out),
            "--gpu-arch", "sm100", "--llmapi-dir", str(llmapi), "--max-seq-len", "512"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    cfg = yaml.safe_load((out / "tensorrt_llm" / "1" / "model.yaml").read_text())
    trained = json.loads((tiny_pair[1] / "config.json").read_text())["block_size"]
    assert cfg["speculative_config"]["max_draft_len"] == trained - 1
    assert cfg["speculative_config"]["attention_backend"] == "TRTLLM" and cfg["max_seq_len"] == 512
    assert (out / "tensorrt_llm" / "1" / "helpers.py").read_text() == "# 1/helpers.py\n"
    result = CliRunner().invoke(cli, args[:-2] + ["--max-seq-len", "1024"])  # re-export replaces atomically
    assert yaml.safe_load((out / "tensorrt_llm" / "1" / "model.yaml").read_text())["max_seq_len"] == 1024


def test_export_errors(tmp_path, tiny_pair):
    runner = CliRunner()
    base = ["export", "trtllm-llmapi", "--out", str(tmp_path / "r")]
    result = runner.invoke(cli, base + ["--config", str(ROOT / "build_configs" / "llama31-8b-nvfp4-blackwell.yaml"), "--gpu-arch", "sm100"])
    assert result.exit_code == 1 and "--block-size" in result.output  # no drafter downloaded here
    result = runner.invoke(cli, base + ["--target", "x", "--draft", "y", "--block-size", "8", "--gpu-arch", "auto"])
    assert result.exit_code == 1 and "no CUDA GPU" in result.output
    result = runner.invoke(cli, base + ["--target", "x", "--draft", "y", "--block-size", "8", "--gpu-arch", "sm75"])
    assert result.exit_code == 1 and "sm90" in result.output
    cfg = tmp_path / "q.yaml"
    cfg.write_text(yaml.safe_dump({"name": "q", "target": str(tiny_pair[0]), "draft": str(tiny_pair[1]),
                                   "backend": "trtllm", "quant": "fp8"}))
    result = runner.invoke(cli, base + ["--config", str(cfg), "--gpu-arch", "sm90"])
    assert result.exit_code == 1 and "pre-quantized" in result.output


def upstream_draft_len(schedule: dict[int, int], batch: int) -> int:
    """TensorRT-LLM's reading (tensorrt_llm/llmapi/llm_args.py, DecodingBaseConfig.draft_len_schedule docstring;
    tests/unittest/_torch/speculative/hw_agnostic/test_min_runtime_draft_len.py@011d093): the value of the
    smallest key >= batch size; past the largest key, 0 (no speculation)."""
    keys = [k for k in sorted(schedule) if k >= batch]
    return schedule[keys[0]] if keys else 0


@pytest.mark.parametrize("block,max_batch,ours,theirs", [
    (16, 8, {4: 8, 8: 4}, {3: 15, 7: 7, 8: 3}),
    (6, 8, {4: 4, 8: 2}, {3: 5, 7: 3, 8: 1}),  # was exported as {1: 5, 4: 3, 8: 1}: batch 2-3 drafted 3, not 5
    (16, 8, {4: 8, 16: 4}, {3: 15, 8: 7}),  # an entry past max_batch_size never applies
    (16, 8, {1: 16, 4: 8}, {3: 15, 8: 7}),
    (16, 4, {2: 1}, {1: 15, 4: 0}),  # block 1: verify the bonus token alone, no drafts
    (16, 32, {4: 32}, {32: 15}),  # a larger block than the export's is capped
])
def test_draft_len_schedule_is_upstreams_upper_bound_reading_of_our_schedule(block, max_batch, ours, theirs):
    from dflash_trt.runtime.width import scheduled_width

    export = _export(block_size=block, max_batch_size=max_batch, block_size_schedule=tuple(sorted(ours.items())))
    schedule = draft_len_schedule(export)
    assert schedule == theirs
    assert schedule[min(schedule)] == block - 1  # upstream's validator: smallest key -> max_draft_len
    for batch in range(1, max_batch + 1):  # our scheduler's verify width, batch by batch
        assert upstream_draft_len(schedule, batch) == scheduled_width(block, ours, batch) - 1, batch


def test_draft_len_schedule_refuses_a_narrower_first_block():
    with pytest.raises(Exception, match="set block_size to 8"):
        draft_len_schedule(_export(block_size_schedule=((1, 8), (4, 4))))


@pytest.mark.parametrize("version", ["1.3.0rc27", "1.3.0", "1.4.0rc1", "1.5.2"])
def test_speculative_config_carries_only_fields_the_release_declares(version):
    """DecodingBaseConfig forbids extra keys (StrictBaseModel extra='forbid', tensorrt_llm/llmapi/llm_args.py):
    every key must be one of the release's fields, as the API reference lists them."""
    from dflash_trt.backends.trtllm import llmapi_fields

    spec = model_yaml(_export(trtllm_version=version, block_size_schedule=((4, 8),)))["speculative_config"]
    assert set(spec) <= llmapi_fields.fields(version)
    assert spec["attention_backend"] in llmapi_fields.release(version).attention_backends
    assert llmapi_fields.fields("1.3.0rc27") == DFLASH_FIELDS  # the table's rc27 row is the API page's field list


@pytest.mark.parametrize("version,message", [("1.2.1", "route A"), ("1.3.0rc20", "documented from 1.3.0rc27"),
                                             ("banana", "not a version")])
def test_releases_without_a_known_dflash_config_are_refused(version, message):
    with pytest.raises(Exception, match=message):
        _export(trtllm_version=version)


def test_parallel_sizes_go_to_model_yaml():
    cfg = model_yaml(_export(tp=4, pp=2, ep=2))
    assert (cfg["tensor_parallel_size"], cfg["pipeline_parallel_size"], cfg["moe_expert_parallel_size"]) == (4, 2, 2)
    assert "moe_expert_parallel_size" not in model_yaml(_export(tp=2))
    with pytest.raises(Exception, match="must divide --tp 4"):
        _export(tp=4, ep=3)


def test_cli_trtllm_version_pp_and_header(tmp_path, tiny_pair):
    base = ["export", "trtllm-llmapi", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
            "--out", str(tmp_path / "r"), "--gpu-arch", "sm90"]
    result = CliRunner().invoke(cli, base + ["--trtllm-version", "1.2.1"])
    assert result.exit_code == 1 and "route A" in result.output
    result = CliRunner().invoke(cli, base + ["--trtllm-version", "1.4.0rc1", "--tp", "2", "--pp", "2"])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "r" / "tensorrt_llm" / "1" / "model.yaml").read_text()
    assert text.startswith("# written by dflash-trt export trtllm-llmapi for TensorRT-LLM 1.4.0rc1")
    cfg = yaml.safe_load(text)
    assert cfg["pipeline_parallel_size"] == 2 and "4 GPU(s)" in result.output and "MPI" in result.output
