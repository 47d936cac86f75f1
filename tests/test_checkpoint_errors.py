"""Bad checkpoints give one clear line naming the file and field, no traceback, exit code 1."""

import json
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from dflash_trt.cli import cli


@pytest.fixture()
def pair(tiny_pair, tmp_path):
    target, draft = tmp_path / "target", tmp_path / "draft"
    shutil.copytree(tiny_pair[0], target)
    shutil.copytree(tiny_pair[1], draft)
    return target, draft


def _generate(target, draft):
    args = ["generate", "--target", str(target), "--draft", str(draft), "--prompt-ids", "1,2,3", "--max-new-tokens", "2"]
    return CliRunner().invoke(cli, args)


def _edit_json(path, **changes):
    data = json.loads(path.read_text())
    for key, value in changes.items():
        node = data
        *parents, leaf = key.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    path.write_text(json.dumps(data))


def _edit_weights(path, fn):
    state = load_file(str(path))
    fn(state)
    save_file(state, str(path))


def _assert_clean_error(result, *fragments):
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = [line for line in result.output.strip().splitlines() if line]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_tensor(pair):
    target, draft = pair
    _edit_weights(target / "model.safetensors", lambda s: s.pop("model.layers.1.mlp.up_proj.weight"))
    _assert_clean_error(_generate(target, draft), str(target), "missing tensors", "model.layers.1.mlp.up_proj.weight")


def test_wrong_shape(pair):
    target, draft = pair
    _edit_weights(draft / "model.safetensors", lambda s: s.__setitem__("fc.weight", s["fc.weight"][:, :64].clone()))
    _assert_clean_error(_generate(target, draft), "fc.weight", "shape [64, 64]", "expected [64, 128]")


def test_unknown_tensor(pair):
    target, draft = pair
    _edit_weights(draft / "model.safetensors", lambda s: s.__setitem__("extra.weight", s["norm.weight"].clone()))
    _assert_clean_error(_generate(target, draft), "unexpected tensors", "extra.weight")


@pytest.mark.parametrize("field,value,fragments", [
    ("vocab_size", 300, ("field 'vocab_size'", "300 != target vocab_size 256")),
    ("dflash_config__target_layer_ids", [1, 9], ("target_layer_ids", "[9] outside", "0..3")),
    ("dflash_config__mask_token_id", 256, ("mask_token_id", "256 is not a row")),
    ("num_target_layers", 36, ("num_target_layers", "36 != target num_hidden_layers 4")),
])
def test_mismatched_pair(pair, field, value, fragments):
    target, draft = pair
    _edit_json(draft / "config.json", **{field: value})
    _assert_clean_error(_generate(target, draft), str(draft / "config.json"), *fragments)


def test_drafter_of_another_hidden_size(pair, tmp_path):
    from tiny_models import make_draft, target_hf_config

    target, _ = pair
    other = target_hf_config(hidden_size=32, head_dim=8)
    make_draft(tmp_path / "other", other)
    _assert_clean_error(_generate(target, tmp_path / "other"), "field 'hidden_size'", "32 != target hidden_size 64")


@pytest.mark.parametrize("archs,fragment", [
    (["GPT2LMHeadModel"], "GPT2LMHeadModel"),
    (None, "missing"),
])
def test_unknown_target_architecture(pair, archs, fragment):
    target, draft = pair
    _edit_json(target / "config.json", architectures=archs)
    _assert_clean_error(_generate(target, draft), "field 'architectures'", fragment, "Qwen3ForCausalLM")


def test_dflash2_drafter_without_its_fields_is_a_clean_error(pair):
    target, draft = pair
    _edit_json(draft / "config.json", architectures=["DFlash2DraftModel"])
    _assert_clean_error(_generate(target, draft), "dflash_config.conv_group_size", "required for DFlash2DraftModel")


def test_dflash2_drafter_without_its_tensors_is_a_clean_error(pair):
    target, draft = pair
    _edit_json(draft / "config.json", architectures=["DFlash2DraftModel"], dflash_config__conv_kernel_size=2,
               dflash_config__conv_group_size=16, dflash_config__selector_rank=8, dflash_config__selector_top_k=4)
    _assert_clean_error(_generate(target, draft), "missing tensors", "attention_conv.base_kernel")


def test_dflash2_group_size_must_divide_the_hidden_size(pair):
    target, draft = pair
    _edit_json(draft / "config.json", architectures=["DFlash2DraftModel"], dflash_config__conv_kernel_size=2,
               dflash_config__conv_group_size=5, dflash_config__selector_rank=8, dflash_config__selector_top_k=4)
    _assert_clean_error(_generate(target, draft), "dflash_config.conv_group_size", "does not divide hidden_size=64")


def test_unsupported_rope_type(pair):
    target, draft = pair
    _edit_json(target / "config.json", rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4})
    _assert_clean_error(_generate(target, draft), "rope_type", "dynamic", "llama3")


def test_broken_json(pair):
    target, draft = pair
    (draft / "config.json").write_text('{"architectures": ["DFlashDraftModel"], ')
    _assert_clean_error(_generate(target, draft), str(draft / "config.json"), "not valid JSON")


def test_truncated_safetensors(pair):
    target, draft = pair
    data = (target / "model.safetensors").read_bytes()
    (target / "model.safetensors").write_bytes(data[: len(data) // 2])
    _assert_clean_error(_generate(target, draft), str(target / "model.safetensors"))


def test_missing_weights_and_folder(pair, tmp_path):
    target, draft = pair
    (draft / "model.safetensors").unlink()
    _assert_clean_error(_generate(target, draft), "no model.safetensors")
    _assert_clean_error(_generate(tmp_path / "nope", draft), "target folder not found")


def test_sharded_index_naming_a_missing_shard(pair):
    target, draft = pair
    state = load_file(str(target / "model.safetensors"))
    (target / "model.safetensors").unlink()
    names = sorted(state)
    save_file({n: state[n] for n in names[:10]}, str(target / "model-00001-of-00002.safetensors"))
    index = {"weight_map": {n: ("model-00001-of-00002.safetensors" if i < 10 else "model-00002-of-00002.safetensors")
                            for i, n in enumerate(names)}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    _assert_clean_error(_generate(target, draft), "model-00002-of-00002.safetensors", "not found")
    save_file({n: state[n] for n in names[10:]}, str(target / "model-00002-of-00002.safetensors"))
    assert _generate(target, draft).exit_code == 0


def test_real_process_prints_no_traceback(pair):
    target, draft = pair
    _edit_json(target / "config.json", architectures=["MistralForCausalLM"])
    proc = subprocess.run(
        [sys.executable, "-m", "dflash_trt.cli", "generate", "--target", str(target), "--draft", str(draft),
         "--prompt-ids", "1,2"], capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "MistralForCausalLM" in proc.stderr


def test_drafter_without_mask_token_id_is_a_clean_error(pair):
    target, draft = pair
    _edit_json(draft / "config.json", dflash_config__mask_token_id=None)  # null: as absent
    _assert_clean_error(_generate(target, draft), str(draft / "config.json"), "dflash_config.mask_token_id",
                        "missing (required)")


def test_unknown_dflash_config_field_is_named(pair):
    target, draft = pair
    _edit_json(draft / "config.json", dflash_config__conv_kernel_size=2)
    _assert_clean_error(_generate(target, draft), "dflash_config.conv_kernel_size", "not a DFlash (v1) setting")
