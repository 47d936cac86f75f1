#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, integration tier included.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
. .venv/bin/activate
python -m pytest -q -ra "$@"
