#!/usr/bin/env bash
# Everything a lent GPU machine can check without TensorRT, for a CUDA machine with a CUDA build of torch
# and nvcc on PATH (one H200: under 8 minutes). Steps, each recorded as passed / failed / skipped:
#   versions     nvcc's CUDA, torch's CUDA and the driver's (nvidia-smi), printed; a mismatch stops the run;
#   cmake_build  kernels for every GPU the routes accept (dflash_trt/kernels/archs.py: sm_80 .. sm_121 +
#                compute_80 PTX), fatbin, CPU twin, TensorRT plugin where its headers are (TENSORRT_ROOT or
#                TRT_ROOT), torch op where torch has CUDA; the fatbin's archs read back;
#   torch_op     the CMake op, else `python -m dflash_trt.kernels.build_op`; an op that does not load stops
#                the run (kernel_status() says why);
#   tests        kernel vs twin vs reference at every dtype x sampling mode (tests/test_verify_kernel_gpu.py)
#                and the dispatch tests after them in the same process (tests/test_kernel_dispatch.py);
#   bench        scripts/bench_verify.py: latency and HBM share at V=151936; any token mismatch fails;
#   memcheck, racecheck   compute-sanitizer on one op call per dtype (skipped without compute-sanitizer);
#   lossless     the torch runner on CUDA, fp32 and bf16, DFlash vs AR (scripts/gpu_lossless.py);
#   cuda_graphs  eager vs CUDA-graph decode (`gpu_lossless.py --cuda-graphs compare`), where the script has it;
#   report       $OUT_DIR/gpu_check.json (logs beside it).
# --dry-run (or DRY_RUN=1) runs what needs no GPU, on any machine: the arguments, the version checks
# (driver and GPU reported "skipped: dry run"), the CMake configure and build of the CUDA sources for one
# arch (sm_90) where nvcc and cmake are, and the report with every GPU step marked skipped.
# Python: $PYTHON, else --venv DIR's, else $VIRTUAL_ENV's, else python3 (else python) on PATH; the CUDA
# build of torch on a lent machine is installed system-wide, so no project venv is sourced.
# Usage: scripts/gpu_check.sh [--dry-run] [--venv DIR] [OUT_DIR]   (default out/gpu_check; env: CUDA_ARCHS
#        (default: the CMake default list), TENSORRT_ROOT=/path/to/TensorRT, PYTHON, BENCH_ITERS=200,
#        STEP_TIMEOUT=240, DRY_RUN=1)
# Exit status: 0 only if every step that was not skipped passed.
set -uo pipefail
CALLER_DIR=$(pwd)
cd "$(dirname "$0")/.."
ROOT=$(pwd)

usage() { sed -n '/^# Usage:/,/^# Exit status/s/^# \{0,1\}//p' "$0"; }
die() { printf 'gpu_check: %s\n' "$*" >&2; exit 2; }

case ${DRY_RUN:-0} in 0 | "" | false | no) DRY_RUN=0 ;; *) DRY_RUN=1 ;; esac
VENV="" OUT_DIR=$ROOT/out/gpu_check
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) DRY_RUN=1 ;;
    --venv) [ $# -ge 2 ] || die "--venv needs a folder"; VENV=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option $1" ;;
    *) OUT_DIR=$1 ;;
  esac
  shift
done
absolute() { case $1 in /*) echo "$1" ;; *) echo "$CALLER_DIR/$1" ;; esac; }  # paths given relative to the caller
OUT_DIR=$(absolute "$OUT_DIR")
[ -z "$VENV" ] || VENV=$(absolute "$VENV")
if [ -n "$VENV" ]; then
  [ -x "$VENV/bin/python" ] || die "--venv $VENV has no bin/python"
  export VIRTUAL_ENV=$VENV PATH=$VENV/bin:$PATH
  PYTHON=$VENV/bin/python
elif [ -z "${PYTHON:-}" ]; then
  if [ -n "${VIRTUAL_ENV:-}" ]; then PYTHON=$VIRTUAL_ENV/bin/python; else PYTHON=$(command -v python3 || command -v python || true); fi
fi
case $PYTHON in */*) PYTHON=$(absolute "$PYTHON") ;; esac  # cmake runs it from its build folder
[ -n "$PYTHON" ] && command -v "$PYTHON" >/dev/null || die "no python3 on PATH (set PYTHON=/path/to/python)"
mkdir -p "$OUT_DIR" || die "cannot create $OUT_DIR"
T=${STEP_TIMEOUT:-240}
DRY_FLAG=() BUILD_DIR=$ROOT/plugins/dflash_verify/build DRY_RUN_SKIP="skipped: dry run"
if [ "$DRY_RUN" = 1 ]; then DRY_FLAG=(--dry-run) BUILD_DIR=$OUT_DIR/cmake_build; fi
STEPS=$OUT_DIR/steps.tsv
: >"$STEPS"
rm -f "$OUT_DIR"/{versions,bench,lossless,cuda_graphs,gpu_check}.json "$OUT_DIR/pytest.xml"

step() { printf '\n== %s\n' "$*"; }
record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STEPS"; }  # step, status, exit status, detail
skip() { record "$1" skipped "" "$2"; echo "$1: $2"; }
# run_step STEP LOG CMD...: CMD under the step timeout, its output on the terminal and in LOG; records the result.
run_step() {
  local name=$1 log=$2 rc=0
  shift 2
  timeout "$T" "$@" 2>&1 | tee "$log" || rc=$?
  if [ "$rc" = 0 ]; then record "$name" passed 0 "log: $log"; else record "$name" failed "$rc" "exit $rc; log: $log"; fi
  return "$rc"
}
finish() {
  step "report"
  "$PYTHON" scripts/gpu_check_steps.py report "$OUT_DIR" --build-dir "$BUILD_DIR" "${DRY_FLAG[@]}"
  local rc=$?
  if [ "$rc" = 0 ]; then echo "gpu_check: OK; report in $OUT_DIR/gpu_check.json"
  else echo "gpu_check: FAILED; see $OUT_DIR/gpu_check.json and the logs beside it" >&2; fi
  exit "$rc"
}

step "versions: nvcc, torch and driver CUDA"
run_step versions "$OUT_DIR/versions.log" "$PYTHON" scripts/gpu_check_steps.py versions \
  --out "$OUT_DIR/versions.json" "${DRY_FLAG[@]}" || finish
[ "$DRY_RUN" = 1 ] || nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null

if [ "$DRY_RUN" = 1 ]; then
  CUDA_ARCHS=90 PTX_ARCHS="" TARGETS=(--target dflash_verify_kernels dflash_verify_fatbin)
else
  PTX_ARCHS=$("$PYTHON" -c "from dflash_trt.kernels import archs; print(';'.join(archs.PTX))") TARGETS=()
  if [ -z "${CUDA_ARCHS:-}" ]; then  # the routes' list where nvcc knows all of it (CUDA >= 12.9), else this GPU's
    CUDA_ARCHS=$("$PYTHON" -c "from dflash_trt.kernels import archs; print(';'.join(archs.SASS))")
    for arch in ${CUDA_ARCHS//;/ }; do
      nvcc --list-gpu-code | grep -qx "sm_$arch" || {
        CUDA_ARCHS=$("$PYTHON" -c "import torch; M, m = torch.cuda.get_device_capability(); print(f'{M}{m}')"); break; }
    done
  fi
fi
step "cmake build (archs: $CUDA_ARCHS${PTX_ARCHS:+ + PTX $PTX_ARCHS})"
if command -v nvcc >/dev/null && command -v cmake >/dev/null; then
  run_step cmake_build "$OUT_DIR/cmake.log" bash -c 'cmake -S plugins/dflash_verify -B "$1" -DCMAKE_BUILD_TYPE=Release \
      -DDFLASH_VERIFY_CUDA_ARCHS="$2" -DDFLASH_VERIFY_PTX_ARCHS="$3" -DPython3_EXECUTABLE="$4" \
      ${TENSORRT_ROOT:+-DTENSORRT_ROOT="$TENSORRT_ROOT"} && cmake --build "$1" -j "$(nproc)" "${@:5}"' \
    _ "$BUILD_DIR" "$CUDA_ARCHS" "$PTX_ARCHS" "$(command -v "$PYTHON")" "${TARGETS[@]}" >/dev/null
  grep -E "dflash_verify:|error" "$OUT_DIR/cmake.log"
else
  skip cmake_build "skipped: nvcc or cmake not on PATH"
fi

step "torch op"
if [ "$DRY_RUN" = 1 ]; then
  skip torch_op "$DRY_RUN_SKIP"
else
  OP_SOURCE=cmake OP_LIB=$BUILD_DIR/libdflash_verify_torch.so
  if [ ! -f "$OP_LIB" ]; then
    OP_SOURCE=cpp_extension
    OP_LIB=$("$PYTHON" -m dflash_trt.kernels.build_op 2>"$OUT_DIR/build_op.log" | tail -n 1)
  fi
  export DFLASH_TRT_VERIFY_LIB=$OP_LIB
  STATUS=$("$PYTHON" -c "from dflash_trt.kernels import kernel_status; print(kernel_status())" 2>&1 | tail -n 1)
  echo "$STATUS"
  case $STATUS in
    "kernel available"*) record torch_op passed 0 "$OP_LIB (via $OP_SOURCE)" ;;
    *) record torch_op failed 1 "$OP_LIB (via $OP_SOURCE): $STATUS; see $OUT_DIR/build_op.log"; finish ;;
  esac
fi

step "tests: kernel vs twin vs reference (every dtype x sampling mode at V=151936), then dispatch"
if [ "$DRY_RUN" = 1 ]; then skip tests "$DRY_RUN_SKIP"; else
  run_step tests "$OUT_DIR/pytest.log" "$PYTHON" -m pytest -q -rs -p no:cacheprovider tests/test_verify_kernel_gpu.py \
    tests/test_kernel_dispatch.py --junitxml="$OUT_DIR/pytest.xml"
fi

step "micro-benchmark: latency, HBM share, agreement"
if [ "$DRY_RUN" = 1 ]; then skip bench "$DRY_RUN_SKIP"; else
  run_step bench "$OUT_DIR/bench.log" "$PYTHON" scripts/bench_verify.py --out "$OUT_DIR/bench.json" \
    --iters "${BENCH_ITERS:-200}"
fi

step "compute-sanitizer: memcheck and racecheck on one op call per dtype"
SANITIZER=$(command -v compute-sanitizer || ls "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
  "$(dirname "$(command -v nvcc || echo nvcc)")/compute-sanitizer" 2>/dev/null | head -n 1)
for tool in memcheck racecheck; do
  if [ "$DRY_RUN" = 1 ]; then skip "$tool" "$DRY_RUN_SKIP"
  elif [ -z "$SANITIZER" ]; then skip "$tool" "skipped: compute-sanitizer not found (PATH, \$CUDA_HOME/bin, nvcc's folder)"
  else  # no caching allocator: every tensor its own allocation, so memcheck sees an access past its end
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 run_step "$tool" "$OUT_DIR/$tool.log" "$SANITIZER" --tool "$tool" \
      --error-exitcode 1 "$PYTHON" scripts/gpu_check_steps.py op-call
  fi
done

step "torch runner on CUDA: DFlash vs AR (fp32, bf16; batch 1, 8; widths 16, 8, 4; T 0, 0.8)"
if [ "$DRY_RUN" = 1 ]; then skip lossless "$DRY_RUN_SKIP"; else
  run_step lossless "$OUT_DIR/lossless.log" "$PYTHON" scripts/gpu_lossless.py --device cuda --out "$OUT_DIR/lossless.json"
fi

step "eager vs CUDA-graph decode (scripts/gpu_lossless.py --cuda-graphs compare)"
if ! "$PYTHON" scripts/gpu_lossless.py --help 2>/dev/null | grep -q -- --cuda-graphs; then
  skip cuda_graphs "skipped: scripts/gpu_lossless.py has no --cuda-graphs"
elif [ "$DRY_RUN" = 1 ]; then skip cuda_graphs "$DRY_RUN_SKIP"; else
  run_step cuda_graphs "$OUT_DIR/cuda_graphs.log" "$PYTHON" scripts/gpu_lossless.py --device cuda --cuda-graphs compare \
    --out "$OUT_DIR/cuda_graphs.json"
fi

finish
