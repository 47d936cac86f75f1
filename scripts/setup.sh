#!/usr/bin/env bash
# Create .venv (if missing) and install dflash-trt with its test / serving dependencies.
# torch is pinned to 2.13.0, the CPU build on local disk; the z-lab oracle goes in with --no-deps.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
. .venv/bin/activate
pip install -q --disable-pip-version-check "torch==2.13.0"
pip install -q --disable-pip-version-check -e ".[dev,serve]"
pip install -q --disable-pip-version-check --no-deps "dflash==0.1.0"
