"""Corrupt or mismatched inputs: one clear line naming the file and field; no partial output folder."""

import json
import shutil

import pytest
from click.testing import CliRunner
from convert_helpers import run_convert
from safetensors.torch import load_file, save_file
from tiny_models import make_draft, make_target

import dflash_trt.convert.pipeline as convert_module
from dflash_trt.backends.torch.parallel import load_trtllm_pair
from dflash_trt.cli import cli
from dflash_trt.convert import ConvertConfig, convert
from dflash_trt.errors import CheckpointError, ConfigError, DFlashTrtError

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def pair(tiny_pair, tmp_path):
    shutil.copytree(tiny_pair[0], tmp_path / "target")
    shutil.copytree(tiny_pair[1], tmp_path / "draft")
    return tmp_path / "target", tmp_path / "draft"


@pytest.fixture(scope="module")
def converted_tp2(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("ok") / "out"
    run_convert(tiny_pair[0], tiny_pair[1], out, tp=2, quant="fp8")
    return out


def _convert(target, draft, out, *extra):
    args = ["convert", "--target", str(target), "--draft", str(draft), "--out", str(out), "--calibrator",
            "builtin", "--calib-samples", "2", "--calib-new-tokens", "4", *extra]
    return CliRunner().invoke(cli, args)


def _assert_one_line_error(result, *fragments):
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.strip().splitlines() if line and not line.startswith("warning:")]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def _assert_no_output(out):
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.tmp-")]


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        node, *parents = data, *key.split("__")[:-1]
        for p in parents:
            node = node[p]
        node[key.split("__")[-1]] = value
    path.write_text(json.dumps(data))


def test_missing_hf_tensor(pair, tmp_path):
    target, draft = pair
    state = load_file(str(target / "model.safetensors"))
    state.pop("model.layers.2.mlp.down_proj.weight")
    save_file(state, str(target / "model.safetensors"))
    _assert_one_line_error(_convert(target, draft, tmp_path / "out"), str(target), "model.layers.2.mlp.down_proj")
    _assert_no_output(tmp_path / "out")


def test_mismatched_pair_names_the_draft_field(pair, tmp_path):
    target, draft = pair
    _edit_json(draft / "config.json", vocab_size=300)
    result = _convert(target, draft, tmp_path / "out")
    _assert_one_line_error(result, str(draft / "config.json"), "field 'vocab_size'", "300 != target vocab_size 256")
    _assert_no_output(tmp_path / "out")


def test_tp_that_does_not_divide_the_heads(pair, tmp_path):
    result = _convert(*pair, tmp_path / "out", "--tp", "3")
    _assert_one_line_error(result, str(pair[0] / "config.json"), "field 'num_attention_heads'", "--tp 3")
    _assert_no_output(tmp_path / "out")


def test_nvfp4_needs_whole_16_blocks(tmp_path):
    hf = make_target(tmp_path / "target", "qwen3", hidden_size=40, head_dim=10, intermediate_size=80)
    make_draft(tmp_path / "draft", hf.config)
    result = _convert(tmp_path / "target", tmp_path / "draft", tmp_path / "out", "--quant", "nvfp4")
    _assert_one_line_error(result, "config.json", "field 'hidden_size'", "not a multiple of the NVFP4 block")
    _assert_no_output(tmp_path / "out")


def test_bad_calibration_line_is_named(pair, tmp_path):
    calib = tmp_path / "calib.jsonl"
    calib.write_text('{"ids": [1, 2, 3]}\n{"ids": [1, 2\n')
    result = _convert(*pair, tmp_path / "out", "--quant", "fp8", "--calib-data", str(calib))
    _assert_one_line_error(result, f"{calib}: line 2", "not valid JSON")
    _assert_no_output(tmp_path / "out")


def test_existing_output_folder_is_left_alone(pair, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    _assert_one_line_error(_convert(*pair, out), str(out), "already exists")
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_convert_config_fields_are_validated_with_file_and_field(tmp_path):
    with pytest.raises(ConfigError, match=r"field 'quant': 'int4' is not one of \['fp8', 'none', 'nvfp4'\]"):
        ConvertConfig("t", "d", "o", quant="int4")
    path = tmp_path / "convert_config.json"
    path.write_text(json.dumps({"target": "t", "draft": "d", "out": "o", "tp": 0}))
    with pytest.raises(ConfigError, match=f"{path}: field 'tp': expected an integer >= 1, got 0"):
        ConvertConfig.load(path)
    path.write_text(json.dumps({"target": "t", "draft": "d", "out": "o", "tpp": 2}))
    with pytest.raises(ConfigError, match="field 'tpp': unknown field"):
        ConvertConfig.load(path)


def test_failure_while_writing_leaves_nothing_behind(pair, tmp_path, monkeypatch):
    calls = []

    def failing_write(folder, cfg, ranks):
        calls.append(folder)
        raise OSError("disk full")

    monkeypatch.setattr(convert_module, "write_checkpoint", failing_write)
    with pytest.raises(OSError):
        convert(ConvertConfig(str(pair[0]), str(pair[1]), str(tmp_path / "out"), calibrator="builtin"))
    assert calls and not calls[0].exists()
    _assert_no_output(tmp_path / "out")


def _copy(converted, tmp_path):
    shutil.copytree(converted, tmp_path / "c")
    return tmp_path / "c" / "target", tmp_path / "c" / "draft"


def _load_error(target, draft) -> str:
    with pytest.raises(DFlashTrtError) as info:
        load_trtllm_pair(target, draft, dtype="fp32", device="cpu")
    message = info.value.format_message()
    assert "\n" not in message
    return message


def test_reader_missing_rank_file(converted_tp2, tmp_path):
    target, draft = _copy(converted_tp2, tmp_path)
    (draft / "rank1.safetensors").unlink()
    assert "rank1.safetensors: file not found (config.json mapping.tp_size is 2)" in _load_error(target, draft)


def test_reader_unknown_quant_algo_names_the_field(converted_tp2, tmp_path):
    target, draft = _copy(converted_tp2, tmp_path)
    _edit_json(target / "config.json", quantization__quant_algo="INT8")
    message = _load_error(target, draft)
    assert str(target / "config.json") in message and "field 'quantization.quant_algo'" in message


def test_reader_config_that_disagrees_with_the_tensors(converted_tp2, tmp_path):
    target, draft = _copy(converted_tp2, tmp_path)
    _edit_json(target / "config.json", intermediate_size=192)
    message = _load_error(target, draft)
    assert "rank0.safetensors: tensor 'transformer.layers.0.mlp.fc.weight' is [64, 64]" in message
    assert "expected [96, 64]" in message and "from config.json" in message


def test_reader_wrong_dtype_and_truncated_file(converted_tp2, tmp_path):
    target, draft = _copy(converted_tp2, tmp_path)
    state = load_file(str(target / "rank1.safetensors"))
    state["transformer.layers.3.attention.qkv.weight"] = state["transformer.layers.3.attention.qkv.weight"].float()
    save_file(state, str(target / "rank1.safetensors"))
    assert "float32, expected [64, 64] torch.float8_e4m3fn" in _load_error(target, draft)
    (target / "rank1.safetensors").write_bytes(b"\x08\x00\x00")
    assert "rank1.safetensors: unreadable safetensors file" in _load_error(target, draft)


def test_reader_rejects_a_swapped_pair(converted_tp2):
    with pytest.raises(CheckpointError, match="expected a target then a DFlash drafter"):
        load_trtllm_pair(converted_tp2 / "draft", converted_tp2 / "target", device="cpu")
