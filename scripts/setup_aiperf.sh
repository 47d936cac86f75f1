#!/usr/bin/env bash
# Create the virtualenv of aiperf (NVIDIA's benchmark client) if missing: AIPERF_VENV, default .venv-aiperf.
# Its own environment, not .venv: aiperf pins its own rich, pandas, transformers, ... It is a client of the
# server only (tests/test_aiperf.py, scripts/bench_aiperf.sh), so nothing of dflash-trt goes in.
set -euo pipefail
cd "$(dirname "$0")/.."
AIPERF_VENV=${AIPERF_VENV:-.venv-aiperf}
PYTHON=${PYTHON:-python3}
if [ ! -x "$AIPERF_VENV/bin/aiperf" ]; then
  "$PYTHON" -m venv "$AIPERF_VENV"
  "$AIPERF_VENV/bin/pip" install -q --disable-pip-version-check "aiperf==0.13.0"
fi
