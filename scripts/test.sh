#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, integration tier included.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/setup_aiperf.sh  # tests/test_aiperf.py drives the real aiperf client against the server
. .venv/bin/activate
# Golden-token regression compares fp32 greedy decodes across machines: pin MKL to one code path so a
# different CPU of the same kind cannot flip a near-tie (MKL conditional numerical reproducibility).
export MKL_CBWR=${MKL_CBWR:-AVX2}
python -m pytest -q -ra "$@"
