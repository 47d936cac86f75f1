"""`dflash-trt check-pair` on the shipped pair, a mismatched pair and a drafter whose taps are off by one."""

import json
import shutil

from click.testing import CliRunner

from dflash_trt.cli import cli
from dflash_trt.engine.config import ASSETS

TARGET, DRAFT = ASSETS / "tiny-qwen3", ASSETS / "tiny-qwen3-dflash"


def _run(*args, prompts: int = 4, tokens: int = 32):
    result = CliRunner().invoke(cli, ["check-pair", *args, "--json", "--num-prompts", str(prompts),
                                      "--max-new-tokens", str(tokens)])
    return result, json.loads(result.output) if result.output.strip().startswith("{") else None


def _by_name(report):
    return {c["name"]: c for c in report["checks"]}


def test_the_shipped_pair_passes_and_prints_each_engines_units():
    result, report = _run("--target", str(TARGET), "--draft", str(DRAFT))
    assert result.exit_code == 0, result.output
    checks = _by_name(report)
    assert report["verdict"] in ("ok", "warn") and not any(c["status"] == "fail" for c in report["checks"])
    assert checks["tap convention -1"]["status"] == "ok" and "tap convention +1" not in checks  # 23 is the last layer
    assert report["tau"]["raw"] > 1.5 and report["tau"]["taps -1"] < max(report["tau"]["raw"], report["tau"]["chat"])
    assert "max_draft_len: 15" in checks["launch settings"]["detail"]
    assert "--speculative-num-draft-tokens 16" in checks["launch settings"]["detail"]
    assert checks["mask token"]["status"] == "ok" and "<|mask|>" in checks["mask token"]["detail"]


def test_a_drafter_of_another_target_is_a_hard_mismatch(tiny_pair):
    result, report = _run("--target", str(tiny_pair[0]), "--draft", str(DRAFT))
    assert result.exit_code == 1
    shapes = _by_name(report)["shapes"]
    assert shapes["status"] == "fail" and "hidden_size" in shapes["detail"]


def test_taps_one_layer_off_are_caught_by_measurement(tmp_path):
    draft = tmp_path / "draft"
    shutil.copytree(DRAFT, draft)
    config = json.loads((draft / "config.json").read_text())
    trained = config["dflash_config"]["target_layer_ids"]
    config["dflash_config"]["target_layer_ids"] = [i - 1 for i in trained]  # the config says one layer lower
    (draft / "config.json").write_text(json.dumps(config))
    # eight prompts x 64 tokens: enough steps that the shifted taps' τ (~2.5 against ~1.95) stands clear
    result, report = _run("--target", str(TARGET), "--draft", str(draft), "--use", "raw", prompts=8, tokens=64)
    assert result.exit_code == 0, result.output  # a warning, not a hard mismatch
    taps = _by_name(report)["tap convention +1"]
    assert taps["status"] == "warn" and "off by one" in taps["detail"], taps


def test_static_only_needs_no_forward_pass():
    result, report = _run("--target", str(TARGET), "--draft", str(DRAFT), "--static")
    assert result.exit_code == 0 and "tau" in report and report["tau"] == {}


def test_shipped_models_go_by_their_builtin_names_on_every_command():
    """check-pair defaults to the shipped pair and takes builtin:NAME, as generate, bench, convert and
    train-draft do; an unknown shipped name is a usage error that lists the shipped ones."""
    result, report = _run("--static")
    assert result.exit_code == 0 and report["verdict"] in ("ok", "warn"), result.output
    named, same = _run("--target", "builtin:tiny-qwen3", "--draft", "builtin:tiny-qwen3-dflash", "--static")
    assert named.exit_code == 0 and same == report
    wrong = CliRunner().invoke(cli, ["check-pair", "--target", "builtin:tiny-qwen9", "--static"])
    assert wrong.exit_code == 2 and "shipped: builtin:tiny-qwen3, builtin:tiny-qwen3-dflash" in wrong.output
    for command in (["generate"], ["bench"], ["convert", "--out", "x"], ["train-draft", "--out", "x"],
                    ["draft-vocab"], ["export", "trtllm-llmapi", "--out", "x"]):
        bad = CliRunner().invoke(cli, [*command, "--target", "builtin:nope"])  # options parse in order: target first
        assert bad.exit_code == 2 and "is not a shipped model" in bad.output, (command, bad.output)
