"""`dflash-trt doctor`: every component reported found or missing, with what to install."""

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_trt.backends.trtllm import versions
from dflash_trt.cli import cli
from dflash_trt.cli import machine as doctor
from dflash_trt.errors import MissingDependencyError

COMPONENTS = ["gpu", "compute capability", "cuda (driver)", "nvcc", "torch", "tensorrt", "tensorrt_llm",
              "tritonserver", "nvidia-modelopt", "onnx", "onnxruntime", "DFlashVerify plugin", "C++ CPU layer"]
SMI_QUERY = "NVIDIA H200, 9.0, 580.65.06\n"
SMI_HEADER = "| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |\n"


def _fake_run(gpu: str | None):
    def run(command, timeout=10.0):
        if command[0] == "nvidia-smi":
            return None if gpu is None else (gpu if len(command) > 1 else SMI_HEADER)
        if command[0] == "nvcc":
            return "Cuda compilation tools, release 13.0, V13.0.48\n"
        return None
    return run


def _no_tritonserver():
    raise MissingDependencyError("no tritonserver")


@pytest.fixture
def no_gpu_stack(monkeypatch):
    from dflash_trt.triton import server

    for module in ("tensorrt", "tensorrt_llm"):
        monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setattr(doctor, "run", _fake_run(None))
    monkeypatch.setattr(server, "find_tritonserver", _no_tritonserver)  # no copy of the pytriton binary


def test_doctor_reports_every_component_with_fixes(no_gpu_stack):
    rows = {r["component"]: r for r in doctor.diagnose()}
    assert list(rows) == COMPONENTS
    assert rows["gpu"]["status"] == "missing" and "driver" in rows["gpu"]["fix"]
    assert rows["tensorrt_llm"]["status"] == "missing" and "tensorrt-llm==1.2.1" in rows["tensorrt_llm"]["fix"]
    assert "1.3.0rc27" in rows["tensorrt_llm"]["detail"]
    assert rows["tensorrt"]["status"] == "missing" and "10.14" in rows["tensorrt"]["fix"]
    assert rows["nvcc"] == {"component": "nvcc", "status": "ok", "version": "13.0", "detail": rows["nvcc"]["detail"],
                            "fix": ""}
    assert rows["C++ CPU layer"]["status"] == "ok" and rows["C++ CPU layer"]["detail"].endswith(".so")
    assert all(r["status"] in ("ok", "missing", "warn") for r in rows.values())
    assert all(r["fix"] for r in rows.values() if r["status"] == "missing")


@pytest.mark.parametrize("query,arch,notes", [
    ("NVIDIA H200, 9.0, 580.65.06", "sm90", "fp8, no nvfp4, DFlash attention VANILLA"),
    ("NVIDIA B200, 10.0, 580.65.06", "sm100", "fp8, nvfp4, DFlash attention TRTLLM"),
    ("NVIDIA RTX PRO 6000, 12.0, 580.65.06", "sm120", "fp8, nvfp4, DFlash attention VANILLA"),
])
def test_doctor_reads_the_gpu(monkeypatch, query, arch, notes):
    monkeypatch.setattr(doctor, "run", _fake_run(query + "\n"))
    rows = {r["component"]: r for r in doctor.probe_gpu()}
    assert rows["gpu"]["version"] == query.split(",")[0] and rows["gpu"]["status"] == "ok"
    assert rows["compute capability"]["version"] == arch and rows["compute capability"]["detail"] == notes
    assert rows["cuda (driver)"]["version"] == "13.0"


def test_tritonserver_missing_is_reported(no_gpu_stack):
    (row,) = doctor.probe_tritonserver()
    assert row["status"] == "missing" and "nvidia-pytriton" in row["fix"]


@pytest.mark.parametrize("version,engine,llmapi", [("1.2.1", True, False), ("1.2.0", True, False),
                                                   ("1.3.0rc15", False, False), ("1.3.0rc27", False, True),
                                                   ("1.3.0", False, True), ("1.4.0rc1", False, True)])
def test_which_route_a_tensorrt_llm_version_serves(version, engine, llmapi):
    assert versions.serves_engine_route(version) is engine
    assert versions.serves_llmapi_route(version) is llmapi


@pytest.mark.parametrize("version,warned", [("1.2.1", False), ("1.3.0rc27", True)])
def test_doctor_says_what_a_reused_prefix_costs_on_route_b(monkeypatch, version, warned):
    monkeypatch.setattr(versions, "installed_version", lambda name: version if name == "tensorrt_llm" else None)
    rows = {r["component"]: r for r in doctor.probe_trtllm()}
    assert ("prefix cache (route B)" in rows) is warned
    if warned:
        assert rows["prefix cache (route B)"]["status"] == "warn"
        assert "acceptance" in rows["prefix cache (route B)"]["detail"]


def test_doctor_cli_table_and_json(no_gpu_stack):
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["components"]
    assert [r["component"] for r in rows] == COMPONENTS
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 0 and "tensorrt_llm" in result.output and "missing" in result.output


def test_doctor_reports_the_cpu_layer_switched_off_or_unbuildable(monkeypatch):
    from dflash_trt.backends.cpu import ops as cpu_ops

    monkeypatch.setenv(cpu_ops.ENV, "0")
    (row,) = doctor.probe_cpu_layers()
    assert row["status"] == "warn" and cpu_ops.ENV in row["fix"]
    monkeypatch.delenv(cpu_ops.ENV)

    def no_compiler():
        raise cpu_ops.MissingDependencyError("no C++ compiler for libdflash_cpu_layer.so")

    monkeypatch.setattr(cpu_ops, "build_library", no_compiler)
    cpu_ops.library.cache_clear()
    try:
        (row,) = doctor.probe_cpu_layers()
        assert row["status"] == "missing" and "no C++ compiler" in row["detail"] and "g++" in row["fix"]
    finally:
        cpu_ops.library.cache_clear()


def test_doctor_and_build_refuse_a_plugin_without_a_kernel_for_the_gpu(monkeypatch, tmp_path):
    """A library compiled (by the real nvcc) for sm_90a only: fine on an H200, refused on an A100."""
    import shutil
    import subprocess

    from dflash_trt.backends.trtllm import build_steps
    from dflash_trt.backends.trtllm.plugin import LIBRARY_ENV
    from dflash_trt.errors import ConfigError

    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not on PATH")
    source, library = tmp_path / "k.cu", tmp_path / "libdflash_verify_trt.so"
    source.write_text("__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n")
    subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-gencode=arch=compute_90a,code=sm_90a", str(source),
                    "-o", str(library)], check=True, capture_output=True)
    monkeypatch.setenv(LIBRARY_ENV, str(library))
    monkeypatch.setattr(doctor, "run", _fake_run(SMI_QUERY))
    (plugin,) = doctor.probe_plugin()
    assert plugin["status"] == "ok" and "sm_90a" in plugin["detail"]
    monkeypatch.setattr(doctor, "run", _fake_run("NVIDIA A100-SXM4-80GB, 8.0, 580.65.06\n"))
    (plugin,) = doctor.probe_plugin()
    assert plugin["status"] == "missing" and "compute capability 8.0" in plugin["detail"] and plugin["fix"]
    build_steps.check_plugin_covers(library, (9, 0))
    with pytest.raises(ConfigError, match="none of which runs on this GPU"):
        build_steps.check_plugin_covers(library, (10, 3))


def test_doctor_accounts_the_outputs_of_a_trtllm_config(no_gpu_stack, tmp_path, tiny_pair):
    import yaml

    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "target": str(tiny_pair[0]), "draft": str(tiny_pair[1]),
                                    "backend": "trtllm", "runtime": {"max_batch_size": 4, "max_seq_len": 256,
                                                                     "sampled_requests": False}}))
    result = CliRunner().invoke(cli, ["doctor", "--json", "--config", str(path)])
    assert result.exit_code == 0, result.output
    reserved = json.loads(result.output)["reserved"]
    assert set(reserved["bytes"]) == {"dflash_taps", "dflash_accept"} and reserved["sampled_requests"] is False
    assert reserved["summary"].startswith("additional outputs reserve")
    result = CliRunner().invoke(cli, ["doctor", "--config", str(tmp_path.parent.parent / "nope.yaml")])
    assert result.exit_code != 0
    preset = Path(__file__).resolve().parent.parent / "build_configs" / "qwen3-8b-fp8-hopper.yaml"
    result = CliRunner().invoke(cli, ["doctor", "--config", str(preset)])  # its pair is not downloaded here
    assert result.exit_code == 0 and "cannot account its outputs" in result.output
