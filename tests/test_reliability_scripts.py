"""The short tier of scripts/fuzz_serve.py and scripts/soak_serve.py (their long runs: docs/reliability.md).

Each starts its own `dflash-trt serve` on the shipped pair, on loopback, and writes a JSON report."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # fuzz / soak: real servers, minutes
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _run(script: str, tmp_path: Path, *args: str) -> dict:
    out = tmp_path / f"{script}.json"
    done = subprocess.run([sys.executable, str(SCRIPTS / script), "--work", str(tmp_path), "--out", str(out), *args],
                          capture_output=True, text=True, timeout=900)
    assert out.is_file(), done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()) | {"returncode": done.returncode}


def test_fuzz_short_tier_has_no_crash_hang_or_changed_tokens(tmp_path):
    report = _run("fuzz_serve.py", tmp_path, "--requests", "150", "--seed", "7", "--faults", "1", "--max-seconds", "300")
    assert report["requests"] == 150 and report["crashes"] == [] and report["hangs"] == 0
    assert report["server_errors"] == 0 and report["canary_unchanged"] and report["returncode"] == 0
    assert report["faults"] == 1 and report["recovery_s"][0] < 30
    classes = {key.split(":")[0] for key in report["outcomes"]}
    assert {"deep_json", "huge_body", "big_prompt", "grpc_malformed", "disconnect"} <= classes


def test_soak_short_tier_keeps_every_token(tmp_path):
    report = _run("soak_serve.py", tmp_path, "--clients", "4", "--seconds", "15", "--warmup-seconds", "0",
                  "--requests-to-check", "6")
    assert report["returncode"] == 0 and report["requests"] > 10
    assert report["errors"]["count"] == 0 and report["mismatches"] == 0
    assert report["neighbour_latency"]["alone_ms"] > 0 and report["rss"]["max_mb"] > 0
