"""`dflash-trt regress` passes on main for the CPU presets, against the committed baselines."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from dflash_trt.cli import cli

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # a whole `dflash-trt regress` run of the CPU preset


def test_cpu_preset_matches_committed_baseline(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert (ROOT / "build_configs" / "baselines" / "tiny-qwen3-dflash.json").is_file()
    result = CliRunner().invoke(cli, ["regress", "build_configs/tiny-cpu.yaml"])
    assert result.exit_code == 0, result.output
    assert "pass" in result.output
