"""scripts/roofline.py on the shipped pair: every pass at every context and thread count, its bytes as the
cache and weights hold them, and shares of the machine's measured limits."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_roofline_reports_each_pass_against_the_machine(tmp_path):
    out = tmp_path / "roofline"
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "roofline.py"), "--contexts", "64,300",
                          "--threads", "1,2", "--repeats", "2", "--out", str(out)],
                         capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads((out / "results.json").read_text())
    assert {(r["threads"], r["context"]) for r in rows} == {(t, c) for t in (1, 2) for c in (64, 300)}
    assert all(r["cpp_threads"] == r["threads"] for r in rows)  # the C++ layer ran at the asked count
    by = {(r["threads"], r["context"], r["pass"].split(" ")[0]): r for r in rows}
    per_position = 24 * 2 * 2 * 48 * 4  # the target's K/V: layers x (K, V) x kv heads x head_dim x fp32
    for t in (1, 2):
        for context in (64, 300):
            assert by[t, context, "AR"]["kv_bytes"] == (context + 1) * per_position
            assert by[t, context, "verify"]["kv_bytes"] == (context + 16) * per_position
            assert by[t, context, "verify"]["flops"] > 15 * by[t, context, "AR"]["flops"]
        # the drafter's window (256) bounds what it reads: the same at 300 as at any longer context
        assert by[t, 300, "draft"]["kv_bytes"] == 2 * (256 + 16) * 2 * 2 * 48 * 4
    for r in rows:
        assert r["seconds"] > 0 and 0 < r["bandwidth_share"] and 0 < r["compute_share"]
    assert "| 300 | verify (target, 16 rows) |" in run.stdout
