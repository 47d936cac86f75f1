"""The GPU check scripts, on what this machine can run: gpu_lossless.py's short CPU tier, gpu_check.sh's refusals."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_gpu_lossless_short_cpu_tier_matches_ar(tmp_path):
    """The same cells a GPU run checks (batch, width, temperature), on CPU in fp32: identical to AR."""
    out = tmp_path / "lossless.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_lossless.py"), "--device", "cpu", "--dtypes",
                           "fp32", "--batch-sizes", "2", "--widths", "16,4", "--temperatures", "0,0.8",
                           "--prompts", "3", "--max-new-tokens", "12", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    report = json.loads(out.read_text())
    cells = report["cells"]
    assert [(c["width"], c["temperature"]) for c in cells] == [(16, 0.0), (16, 0.8), (4, 0.0), (4, 0.8)]
    assert all(c["identical"] and c["first_divergence"] is None for c in cells)
    assert cells[0]["tau"] > 1.0 and report["failed"] == []


def test_first_divergence_names_the_request_and_position():
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_lossless import first_divergence

    assert first_divergence([[1, 2, 3], [4, 5, 6]], [[1, 2, 3], [4, 9, 6]]) == {
        "request": 1, "position": 1, "got": [5, 6], "ar": [9, 6]}
    assert first_divergence([[1, 2]], [[1, 2]]) is None


def gpu_check(out: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    """scripts/gpu_check.sh with this interpreter; its exit, output and JSON report."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), *args, str(out)], capture_output=True,
                          text=True, timeout=240, env={**os.environ, "PYTHON": sys.executable, **env})
    report = out / "gpu_check.json"
    return done, json.loads(report.read_text()) if report.exists() else {}


def test_gpu_check_stops_at_the_versions_step_without_a_cuda_torch(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: run scripts/gpu_check.sh itself")
    done, report = gpu_check(tmp_path)
    assert done.returncode == 1 and "is a CPU build: install a CUDA build of torch" in done.stdout
    steps = report["steps"]
    assert steps["versions"]["status"] == "failed" and report["failed_steps"] == ["versions"]
    assert steps["cmake_build"] == {"status": "skipped", "exit_status": None,
                                    "detail": "not run: an earlier step failed"}


@pytest.mark.integration
@pytest.mark.slow
def test_gpu_check_dry_run_builds_for_one_arch_and_reports_the_gpu_steps_skipped(tmp_path):
    """--dry-run on a CPU machine: versions checked without driver or GPU, the CUDA sources configured and built
    for sm_90 where nvcc and cmake are, every GPU step reported "skipped: dry run", exit 0."""
    done, report = gpu_check(tmp_path, "--dry-run")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    steps = report["steps"]
    assert list(steps) == ["versions", "cmake_build", "torch_op", "tests", "bench", "memcheck", "racecheck",
                           "lossless", "cuda_graphs"]
    assert report["dry_run"] and report["passed"] and report["failed_steps"] == []
    assert steps["versions"]["status"] == "passed"
    assert report["versions"]["driver_cuda"] == report["versions"]["gpu"] == "skipped: dry run"
    for name in ("torch_op", "tests", "bench", "memcheck", "racecheck", "lossless"):
        assert steps[name] == {"status": "skipped", "exit_status": None, "detail": "skipped: dry run"}, name
    assert steps["cuda_graphs"]["status"] == "skipped"
    if shutil.which("nvcc") and shutil.which("cmake"):
        assert steps["cmake_build"]["status"] == "passed"
        assert report["build"]["fatbin"].startswith(str(tmp_path))  # its own build folder, not the checkout's
        assert report["build"]["fatbin_archs"] == {"sass": ["90"], "ptx": []}
        assert report["versions"]["nvcc_cuda"][0].isdigit()
    else:
        assert steps["cmake_build"]["detail"] == "skipped: nvcc or cmake not on PATH"


def test_gpu_check_dry_run_from_the_environment_and_bad_options(tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--venv"], capture_output=True, text=True)
    assert done.returncode == 2 and "--venv needs a folder" in done.stderr
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--fast"], capture_output=True, text=True)
    assert done.returncode == 2 and "unknown option --fast" in done.stderr and "Usage:" in done.stderr


def test_version_check_names_what_cannot_work_together():
    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check_steps import version_problems

    ok = {"nvcc_cuda": "12.8", "cmake": "found", "torch": "2.8.0+cu128", "torch_cuda": "12.8", "driver_cuda": "12.9",
          "gpu": "NVIDIA H200"}
    assert version_problems(ok, dry_run=False) == []
    problems = version_problems({**ok, "nvcc_cuda": "13.0", "driver_cuda": "12.4"}, dry_run=False)
    assert "nvcc is CUDA 13.0 but torch was built with CUDA 12.8" in problems[0]
    assert problems[1].startswith("the driver supports CUDA 12.4, older than nvcc's CUDA 13.x")
    cpu = {**ok, "torch_cuda": "none: a CPU build of torch", "driver_cuda": "skipped: dry run",
           "gpu": "skipped: dry run"}
    assert version_problems(cpu, dry_run=True) == []
    no_tools = {**cpu, "nvcc_cuda": "missing: nvcc not on PATH", "cmake": "missing: cmake not on PATH"}
    assert version_problems(no_tools, dry_run=True) == []  # a dry run then skips its build
    assert version_problems({**no_tools, "driver_cuda": "12.8", "gpu": "NVIDIA H200", "torch_cuda": "12.8"},
                            dry_run=False) == ["missing: nvcc not on PATH", "missing: cmake not on PATH"]
    assert version_problems({**cpu, "driver_cuda": "unknown", "gpu": "none visible"}, dry_run=False) == [
        "torch 2.8.0+cu128 is a CPU build: install a CUDA build of torch"]


def test_bench_peak_bandwidth_comes_from_the_datasheet_table_by_device_name():
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_verify import hbm_share, peak_bandwidth

    assert peak_bandwidth("NVIDIA H200", None) == (4800.0, "datasheet (H200)")
    assert peak_bandwidth("NVIDIA H100 NVL", None)[0] == 3900.0
    assert peak_bandwidth("NVIDIA GH200 480GB", 4000.0) == (4000.0, "device properties (2 x bus width x memory clock)")
    # 4.8 MB read in 10 us at 4.8 TB/s: a tenth of the peak
    share = hbm_share({"bytes": 4_800_000, "kernel_cold": {"median": 10.0}}, {"bytes": 48_000_000, "median_us": 20.0},
                      4800.0)
    assert share == pytest.approx({"b1_cold": 0.1, "b64": 0.5})
