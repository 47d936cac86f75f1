"""Build configs, bundles (atomic, reused, hash-checked), publish and regression comparison."""

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace

import pytest
import yaml
from click.testing import CliRunner

from dflash_trt.backends.torch.bundle import load_bundle
from dflash_trt.cli import cli
from dflash_trt.engine.config import load_build_config
from dflash_trt.errors import CheckpointError, ConfigError
from dflash_trt.runtime.build import build
from dflash_trt.triton.repository import publish


def _config(tmp_path, tiny_pair, **overrides):
    data = {
        "name": "tiny-random", "target": str(tiny_pair[0]), "draft": str(tiny_pair[1]), "backend": "torch",
        "dtype": "fp32", "block_size": 4,
        "runtime": {"device": "cpu", "max_batch_size": 2, "max_seq_len": 64},
        "golden": {"prompts": [{"token_ids": [1, 2, 3]}, {"token_ids": [7, 8]}], "max_new_tokens": 6},
        "output": "bundle", "repository": "repo",
    }
    data.update(overrides)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("edit,fragment", [
    ({"backend": "tensorrt"}, "field 'backend': expected one of torch, trtllm"),
    ({"runtime": {"max_batch_size": 0}}, "field 'runtime.max_batch_size': must be >= 1"),
    ({"runtime": {"max_batch": 4}}, "field 'runtime.max_batch': unknown"),
    ({"block_size": "eight"}, "field 'block_size': expected int"),
    ({"golden": {"max_new_tokens": 0}}, "field 'golden.max_new_tokens': must be >= 1"),
    ({"name": "bad name!"}, "field 'name'"),
    ({"runtime": {"block_size_schedule": {4: 0}}}, "field 'runtime.block_size_schedule'"),
    ({"runtime": {"draft_confidence": 1.5}}, "field 'runtime.draft_confidence': expected a probability"),
    ({"runtime": {"draft_confidence": "high"}}, "field 'runtime.draft_confidence': expected float"),
    ({"runtime": {"draft_vocab_size": 0}}, "field 'runtime.draft_vocab_size': expected a positive int"),
])
def test_config_errors_name_file_and_field(tmp_path, tiny_pair, edit, fragment):
    path = _config(tmp_path, tiny_pair, **edit)
    with pytest.raises(ConfigError) as err:
        load_build_config(path)
    assert str(path) in err.value.format_message() and fragment in err.value.format_message()


def test_missing_field_and_broken_yaml(tmp_path):
    (tmp_path / "a.yaml").write_text("name: x\ntarget: t\n")
    with pytest.raises(ConfigError, match="field 'draft': missing"):
        load_build_config(tmp_path / "a.yaml")
    (tmp_path / "b.yaml").write_text("name: [x\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_build_config(tmp_path / "b.yaml")


def test_build_records_manifest_and_reuses_unchanged(tmp_path, tiny_pair):
    cfg = load_build_config(_config(tmp_path, tiny_pair))
    path, manifest, reused = build(cfg, log=lambda m: None)
    assert not reused and path == tmp_path / "bundle"
    assert manifest["golden"]["matches_autoregressive"]
    assert manifest["fingerprint"]["target"]["model.safetensors"]
    assert {"target/model.safetensors", "draft/model.safetensors", "build_config.yaml"} <= set(manifest["files"])
    assert manifest["versions"]["torch"].startswith("2.13")
    again = build(cfg, log=lambda m: None)
    assert again[2] is True
    changed = replace(cfg, block_size=3)
    assert build(changed, log=lambda m: None)[2] is False
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.")]


def test_draft_vocabulary_goes_into_the_bundle_and_is_served(tmp_path, tiny_pair):
    import shutil
    from collections import Counter

    from dflash_trt.model import draft_vocab

    cfg = load_build_config(_config(tmp_path, tiny_pair, runtime={"device": "cpu", "max_batch_size": 2,
                                                                  "max_seq_len": 64, "draft_vocab_size": 30}))
    with pytest.raises(ConfigError, match="field 'runtime.draft_vocab_size'.*dflash-trt draft-vocab"):
        build(cfg, log=lambda m: None)
    draft = tmp_path / "draft"
    shutil.copytree(tiny_pair[1], draft)
    draft_vocab.write_vocab_file(draft, draft_vocab.vocab_record(Counter({t: 300 - t for t in range(100)}), 256, "t"))
    cfg = replace(cfg, draft=str(draft))
    path, manifest, _ = build(cfg, log=lambda m: None)
    assert "draft/dflash_trt_draft_vocab.json" in manifest["files"] and manifest["golden"]["matches_autoregressive"]
    _, pair = load_bundle(path)
    assert pair.draft.vocab_size == 30


def test_corrupted_bundle_is_refused_at_load_and_publish(tmp_path, tiny_pair):
    cfg = load_build_config(_config(tmp_path, tiny_pair))
    path, _, _ = build(cfg, log=lambda m: None)
    weights = path / "draft" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 differs from manifest.json"):
        load_bundle(path)
    with pytest.raises(CheckpointError, match="draft/model.safetensors"):
        publish(path, tmp_path / "repo")
    assert build(cfg, log=lambda m: None)[2] is False  # a corrupted bundle is rebuilt, not reused


def test_publish_renders_both_models(tmp_path, tiny_pair):
    cfg = load_build_config(_config(tmp_path, tiny_pair))
    path, manifest, _ = build(cfg, log=lambda m: None)
    repo = publish(path, tmp_path / "repo")
    for name, block in (("dflash", "4"), ("dflash_ar", "1")):
        text = (repo / name / "config.pbtxt").read_text()
        assert f'name: "{name}"' in text and "decoupled: true" in text
        assert f'key: "block_size"\n  value: {{ string_value: "{block}" }}' in text
        assert str(path) in text
        assert (repo / name / "1" / "model.py").is_file()


def test_killed_build_leaves_no_partial_bundle(tmp_path, tiny_pair):
    config = _config(tmp_path, tiny_pair, golden={"prompts": [{"token_ids": list(range(1, 40))}] * 6,
                                                  "max_new_tokens": 20})
    proc = subprocess.Popen([sys.executable, "-m", "dflash_trt.cli", "build", str(config), "--no-publish"],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # wait until the build is writing into its temp folder
        if line.startswith("golden outputs"):
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "bundle").exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.tmp-")]
    assert leftovers, "the killed build should have been writing into a temp folder"
    result = CliRunner().invoke(cli, ["build", str(config), "--no-publish"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "bundle" / "manifest.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".bundle.tmp-")]


@pytest.mark.parametrize("quant,kv", [("fp8", "auto"), ("nvfp4", "fp8")])
def test_quantized_bundle_holds_trtllm_checkpoints_and_serves_losslessly(tmp_path, tiny_pair, quant, kv):
    cfg = load_build_config(_config(tmp_path, tiny_pair, quant=quant, kv_cache=kv))
    path, manifest, _ = build(cfg, log=lambda m: None)
    assert manifest["format"] == "trtllm-checkpoint"
    assert (path / "target" / "rank0.safetensors").is_file() and (path / "draft" / "rank0.safetensors").is_file()
    assert manifest["golden"]["matches_autoregressive"]  # lossless w.r.t. the quantized target itself
    _, pair = load_bundle(path)
    assert pair.draft is not None


def test_regress_passes_then_fails_on_changed_golden(tmp_path, tiny_pair):
    config = _config(tmp_path, tiny_pair)
    baselines = tmp_path / "baselines"
    run = lambda *extra: CliRunner().invoke(cli, ["regress", str(config), "--baselines", str(baselines), *extra])  # noqa: E731
    first = run("--update")
    assert first.exit_code == 0, first.output
    assert run().exit_code == 0
    path = baselines / "tiny-random.json"
    baseline = json.loads(path.read_text())
    baseline["golden_token_ids"][1][2] = (baseline["golden_token_ids"][1][2] + 1) % 256
    path.write_text(json.dumps(baseline))
    failed = run()
    assert failed.exit_code == 1 and "golden prompt 1: tokens differ from position 2" in failed.output
    assert run("--update").exit_code == 0
    baseline = json.loads(path.read_text())
    baseline["mean_acceptance_length"] = 50.0
    path.write_text(json.dumps(baseline))
    failed = run()
    assert failed.exit_code == 1 and "τ 1.000 < 47.500" in failed.output
