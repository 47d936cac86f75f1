#!/usr/bin/env bash
# Everything a lent GPU machine can check without TensorRT (one H200: under 8 minutes), for a CUDA
# machine with a CUDA build of torch and nvcc on PATH:
#   1. CMake build: kernels for every GPU the routes accept (the default: dflash_trt/kernels/archs.py,
#      sm_80 .. sm_121 + compute_80 PTX), fatbin, CPU twin, TensorRT plugin where its headers are
#      (TENSORRT_ROOT or TRT_ROOT), torch op where torch has CUDA; the fatbin's archs read back;
#   2. the torch op (the CMake one, else `python -m dflash_trt.kernels.build_op`);
#   3. pytest: plugin kernels vs the reference and the CPU twin (-m gpu), dispatch tests;
#   4. micro-benchmark: latency at B=1, K=15, V=151936 and read bandwidth at B=64;
#   5. the torch runner on CUDA, fp32 and bf16, lossless vs AR at the presets' batch sizes (1, 8) and
#      block widths (16, 8, 4), greedy and sampled (scripts/gpu_lossless.py; fp32 required identical);
#   6. one JSON report: $OUT_DIR/gpu_check.json (logs beside it).
# Usage: scripts/gpu_check.sh [OUT_DIR]   (default out/gpu_check; env: CUDA_ARCHS (default: the CMake
#        default list), TENSORRT_ROOT=/path/to/TensorRT, PYTHON=python, BENCH_ITERS=200, STEP_TIMEOUT=240)
# Exit status: 0 only if the build, every test, the benchmark's agreement check and the lossless check passed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
OUT_DIR=${1:-out/gpu_check}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
PYTHON=${PYTHON:-python}
BUILD_DIR=$ROOT/plugins/dflash_verify/build
if [ -z "${VIRTUAL_ENV:-}" ] && [ -f .venv/bin/activate ]; then . .venv/bin/activate; fi

step() { printf '\n== %s\n' "$*"; }
die() { printf 'gpu_check: %s\n' "$*" >&2; exit 1; }
trap 'printf "gpu_check: failed at line %s (logs in %s)\n" "$LINENO" "$OUT_DIR" >&2' ERR

step "environment"
command -v nvcc >/dev/null || die "nvcc not on PATH (install the CUDA toolkit or add its bin/ to PATH)"
command -v cmake >/dev/null || die "cmake not on PATH (pip install cmake, or apt-get install cmake)"
"$PYTHON" - <<'EOF' || die "needs a CUDA build of torch and a visible GPU (see the message above)"
import sys, torch
if torch.version.cuda is None:
    sys.exit(f"torch {torch.__version__} is a CPU build")
if not torch.cuda.is_available():
    sys.exit("torch.cuda.is_available() is False: no visible GPU or driver")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) on {torch.cuda.get_device_name(0)}")
EOF
nvcc --version | tail -n 2
if [ -z "${CUDA_ARCHS:-}" ]; then  # the routes' list where nvcc knows all of it (CUDA >= 12.9), else this GPU's
  CUDA_ARCHS=$("$PYTHON" -c "from dflash_trt.kernels import archs; print(';'.join(archs.SASS))")
  for arch in ${CUDA_ARCHS//;/ }; do
    nvcc --list-gpu-code | grep -qx "sm_$arch" || {
      CUDA_ARCHS=$("$PYTHON" -c "import torch; M, m = torch.cuda.get_device_capability(); print(f'{M}{m}')"); break; }
  done
fi
T=${STEP_TIMEOUT:-240}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true

step "cmake build (archs: $CUDA_ARCHS)"
BUILD_STATUS=ok
{
  cmake -S plugins/dflash_verify -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
    -DDFLASH_VERIFY_CUDA_ARCHS="$CUDA_ARCHS" -DPython3_EXECUTABLE="$(command -v "$PYTHON")" \
    ${TENSORRT_ROOT:+-DTENSORRT_ROOT="$TENSORRT_ROOT"} &&
  timeout "$T" cmake --build "$BUILD_DIR" -j "$(nproc)"
} >"$OUT_DIR/cmake.log" 2>&1 || BUILD_STATUS=failed
grep -E "dflash_verify:|error" "$OUT_DIR/cmake.log" || true
echo "cmake build: $BUILD_STATUS"

step "torch op"
OP_SOURCE=cmake
OP_LIB=$BUILD_DIR/libdflash_verify_torch.so
if [ ! -f "$OP_LIB" ]; then
  OP_SOURCE=cpp_extension
  OP_LIB=$("$PYTHON" -m dflash_trt.kernels.build_op 2>"$OUT_DIR/build_op.log" | tail -n 1) ||
    die "building the torch op failed; see $OUT_DIR/build_op.log"
fi
export DFLASH_TRT_VERIFY_LIB=$OP_LIB
"$PYTHON" -c "from dflash_trt.kernels import kernel_status; print(kernel_status())"
echo "torch op: $OP_LIB (via $OP_SOURCE)"

step "tests (kernel vs reference, twin vs reference, dispatch)"
TEST_STATUS=0
timeout "$T" "$PYTHON" -m pytest -q -rs tests/test_verify_plugin.py tests/test_verify_kernel_gpu.py tests/test_kernel_dispatch.py \
  --junitxml="$OUT_DIR/pytest.xml" 2>&1 | tee "$OUT_DIR/pytest.log" || TEST_STATUS=$?

step "micro-benchmark"
BENCH_STATUS=0
timeout "$T" "$PYTHON" scripts/bench_verify.py --out "$OUT_DIR/bench.json" --iters "${BENCH_ITERS:-200}" \
  2>&1 | tee "$OUT_DIR/bench.log" || BENCH_STATUS=$?

step "torch runner on CUDA: DFlash vs AR (fp32, bf16; batch 1, 8; widths 16, 8, 4; T 0, 0.8)"
LOSSLESS_STATUS=0
timeout "$T" "$PYTHON" scripts/gpu_lossless.py --device cuda --out "$OUT_DIR/lossless.json" \
  2>&1 | tee "$OUT_DIR/lossless.log" || LOSSLESS_STATUS=$?

step "report"
"$PYTHON" - "$OUT_DIR" "$BUILD_STATUS" "$OP_SOURCE" "$OP_LIB" "$TEST_STATUS" "$BENCH_STATUS" "$CUDA_ARCHS" "$LOSSLESS_STATUS" <<'EOF'
import json, platform, subprocess, sys, xml.etree.ElementTree as ET
from pathlib import Path
import torch
from dflash_trt.kernels import archs as kernel_archs
out, build, op_source, op_lib, test_rc, bench_rc, archs, lossless_rc = sys.argv[1:]
out = Path(out)
tests = {}
if (out / "pytest.xml").exists():
    root = ET.parse(out / "pytest.xml").getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    tests = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
report = {
    "host": platform.node(), "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
    "torch_cuda": torch.version.cuda, "nvcc": nvcc, "cuda_archs": archs.split(";"),
    "build": {"cmake": build, "torch_op": op_lib, "torch_op_via": op_source},
    "tests": {"exit_status": int(test_rc), **tests},
    "bench": json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else None,
    "bench_exit_status": int(bench_rc),
    "lossless": json.loads((out / "lossless.json").read_text()) if (out / "lossless.json").exists() else None,
    "lossless_exit_status": int(lossless_rc),
}
build_dir = Path("plugins/dflash_verify/build")
report["build"]["tensorrt_plugin"] = str(build_dir / "libdflash_verify_trt.so") \
    if (build_dir / "libdflash_verify_trt.so").exists() else None
fatbin = build_dir / "verify_kernels.fatbin"
if fatbin.exists():
    built = kernel_archs.library_archs(fatbin)
    report["build"]["fatbin_archs"] = {"sass": list(built.sass), "ptx": list(built.ptx),
                                      "covers_this_gpu": kernel_archs.covers(built, torch.cuda.get_device_capability())}
(out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
print(f"wrote {out / 'gpu_check.json'}: tests {tests}, build {build}, bench exit {bench_rc}")
EOF
trap - ERR
[ "$BUILD_STATUS" = ok ] && [ "$TEST_STATUS" = 0 ] && [ "$BENCH_STATUS" = 0 ] && [ "$LOSSLESS_STATUS" = 0 ] || {
  echo "gpu_check: FAILED (build $BUILD_STATUS, tests $TEST_STATUS, bench $BENCH_STATUS, lossless $LOSSLESS_STATUS); see $OUT_DIR" >&2
  exit 1
}
echo "gpu_check: OK; report in $OUT_DIR/gpu_check.json"
