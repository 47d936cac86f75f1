"""trtllm presets load, say what to download, are skipped without TensorRT-LLM; GPU stacks stay optional."""

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_trt.engine.config import load_build_config
from dflash_trt.engine.regress import can_build, regress_one
from dflash_trt.errors import MissingDependencyError
from dflash_trt.runtime.build import build

ROOT = Path(__file__).resolve().parent.parent
PRESETS = {
    "qwen3-8b-fp8-hopper": ("fp8", "fp8", ["Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16"]),
    "llama31-8b-nvfp4-blackwell": ("nvfp4", "fp8", ["meta-llama/Llama-3.1-8B-Instruct",
                                                    "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"]),
    "gpt-oss-20b": ("none", "auto", ["openai/gpt-oss-20b", "z-lab/gpt-oss-20b-DFlash"]),
}
GPU_STACKS = ("tensorrt", "tensorrt_llm", "onnxruntime", "onnx", "pytriton", "tritonclient")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_loads_and_names_its_downloads(name, monkeypatch, tmp_path):
    path = ROOT / "build_configs" / f"{name}.yaml"
    cfg = load_build_config(path)
    quant, kv_cache, repos = PRESETS[name]
    assert (cfg.name, cfg.backend, cfg.quant, cfg.kv_cache, cfg.tp) == (name, "trtllm", quant, kv_cache, 1)
    assert cfg.runtime.device == "cuda" and cfg.target_path().parent == ROOT / "models"
    text = path.read_text()
    for repo in repos:
        assert f"huggingface-cli download {repo} --local-dir models/" in text
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    assert "tensorrt_llm not installed" in can_build(cfg)
    outcome = regress_one(path, tmp_path, update=False, build=build)
    assert outcome.status == "skip"


def test_gpt_oss_preset_says_what_is_missing():
    text = (ROOT / "build_configs" / "gpt-oss-20b.yaml").read_text()
    assert "NOT BUILDABLE" in text and "export trtllm-llmapi" in text
    for missing in ("mixture-of-experts", "attention sinks", "sliding-window", "MXFP4"):
        assert missing in text


def test_trtllm_entry_points_name_the_package_to_install(monkeypatch, tmp_path):
    for module in GPU_STACKS[:3]:
        monkeypatch.setitem(sys.modules, module, None)
    from dflash_trt.backends.trtllm import sessions
    from dflash_trt.backends.trtllm.plugin import register
    from dflash_trt.backends.trtllm.runner import TrtllmTargetRunner, load_trtllm_runners

    checks = [(lambda: TrtllmTargetRunner.open(tmp_path, {}, 1), r"tensorrt-llm==1\.2\.1"),
              (lambda: load_trtllm_runners(tmp_path, 1), r"tensorrt-llm==1\.2\.1"),
              (lambda: sessions.TrtSession(tmp_path / "x.engine"), r"tensorrt~=10\.14"),
              (lambda: sessions.build_engine(tmp_path / "x.onnx", tmp_path / "x.engine", {}), r"tensorrt~=10\.14"),
              (lambda: sessions.OrtSession(tmp_path / "x.onnx"), r"onnxruntime"),
              (lambda: register(tmp_path / "lib.so"), r"tensorrt~=10\.14")]
    for call, message in checks:
        with pytest.raises(MissingDependencyError, match=message):
            call()


def test_import_and_help_without_gpu_stacks():
    """A fresh interpreter where every GPU / serving stack is absent: imports and every --help work."""
    code = (f"import sys\nfor m in {GPU_STACKS!r}: sys.modules[m] = None\n"
            "import dflash_trt, dflash_trt.cli\n"
            "import dflash_trt.backends.trtllm.build, dflash_trt.backends.trtllm.runner, dflash_trt.backends.trtllm.llmapi, "
            "dflash_trt.cli.machine, dflash_trt.backends.trtllm.target_model_cls, dflash_trt.backends.trtllm.draft_runner\n"
            "from click.testing import CliRunner\n"
            "for args in ([], ['build'], ['export'], ['export', 'trtllm-llmapi'], ['doctor'], ['regress']):\n"
            "    r = CliRunner().invoke(dflash_trt.cli.cli, args + ['--help'])\n"
            "    assert r.exit_code == 0, (args, r.output)\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_cli_help_lists_export_and_doctor():
    from dflash_trt.cli import cli

    result = CliRunner().invoke(cli, ["--help"])
    assert "export" in result.output and "doctor" in result.output


@pytest.mark.parametrize("trtllm,trt,message", [("1.4.0rc1", "10.14.1.48", "route B serves newer releases"),
                                                ("1.2.1", "10.13.3.9", "needs TensorRT 10.14"),
                                                ("1.2.1", "10.14.1.48", None)])
def test_route_a_checks_the_installed_versions(monkeypatch, trtllm, trt, message):
    from dflash_trt.backends.trtllm import versions

    monkeypatch.setattr(versions, "installed_version", {"tensorrt_llm": trtllm, "tensorrt": trt}.get)
    if message is None:
        versions.require_engine_route("x")
        return
    with pytest.raises(MissingDependencyError, match=message):
        versions.require_engine_route("x")
    assert "26.04-trtllm-python-py3" in versions.CONTAINER
