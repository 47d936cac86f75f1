"""The GPU check scripts, on what this machine can run: gpu_lossless.py's short CPU tier, gpu_check.sh's refusals."""

import json
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
                           "fp32", "--batch-sizes", "2", "--widths", "16,4", "--temperatures", "0,0.8", "--prompts", "3",
                           "--max-new-tokens", "12", "--out", str(out)], capture_output=True, text=True, timeout=300)
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


def test_gpu_check_refuses_a_machine_without_a_cuda_torch():
    if shutil.which("nvcc") is None or shutil.which("cmake") is None:
        pytest.skip("gpu_check.sh stops earlier without nvcc / cmake")
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: run scripts/gpu_check.sh itself")
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "/tmp/gpu_check_refused"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "needs a CUDA build of torch" in done.stderr
