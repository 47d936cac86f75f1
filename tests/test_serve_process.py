"""`dflash-trt serve` as a process, with a real tritonserver: leftovers ignored, output inherited,
a failed start explained in a few lines, no orphan server when serve is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dflash_trt.engine.config import load_build_config
from dflash_trt.runtime import backends
from dflash_trt.triton.repository import publish
from dflash_trt.triton.server import Ports

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def repo(tmp_path_factory, tiny_pair):
    root = tmp_path_factory.mktemp("serve")
    data = {"name": "tiny-random", "target": str(tiny_pair[0]), "draft": str(tiny_pair[1]), "backend": "torch",
            "dtype": "fp32", "block_size": 4, "runtime": {"device": "cpu", "max_batch_size": 2, "max_seq_len": 64},
            "golden": {"prompts": [{"token_ids": [1, 2, 3]}], "max_new_tokens": 4}, "output": "bundle"}
    (root / "cfg.yaml").write_text(yaml.safe_dump(data))
    bundle, _, _ = backends.build(load_build_config(root / "cfg.yaml"), log=lambda m: None)
    return publish(bundle, root / "repo")


def _serve(repository: Path, *extra: str) -> tuple[subprocess.Popen, Ports]:
    ports = Ports.pick()
    cmd = [sys.executable, "-m", "dflash_trt.cli", "serve", str(repository), "--http-port", str(ports.http),
           "--grpc-port", str(ports.grpc), "--metrics-port", str(ports.metrics), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True), ports


def _read_until(proc: subprocess.Popen, needle: str, timeout: float = 120) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line and proc.poll() is not None:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"{needle!r} not seen; output:\n{''.join(lines[-40:])}")


def _server_pids(repository: Path) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"tritonserver") for part in cmdline[:5]) and \
                f"--model-repository={repository.resolve()}".encode() in cmdline:
            pids.append(int(proc.name))
    return pids


def test_killed_serve_takes_its_server_along_and_leftovers_are_ignored(tmp_path, repo):
    import shutil

    repository = Path(shutil.copytree(repo, tmp_path / "repo"))
    leftover = repository / ".dflash.tmp-999999-zz"  # an interrupted publish of an older version
    shutil.copytree(repository / "dflash", leftover)
    proc, _ = _serve(repository)
    try:
        lines = _read_until(proc, "ready:")
        text = "".join(lines)
        assert f"{leftover.name}: not a model folder" in text and "ignored" in text
        assert "Started GRPCInferenceService" in text  # no --log: the server's output is inherited
        (server,) = _server_pids(repository)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while _server_pids(repository) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _server_pids(repository) == [], "tritonserver outlived a killed `dflash-trt serve`"
    finally:
        for pid in _server_pids(repository):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()


def test_a_failed_start_says_why_in_a_few_lines(tmp_path, repo):
    import shutil

    repository = Path(shutil.copytree(repo, tmp_path / "repo"))
    config = repository / "dflash" / "config.pbtxt"
    config.write_text(config.read_text().replace("bundle_manifest_sha256", "bundle_manifest_sha256_was"))
    log = tmp_path / "server.log"
    proc, _ = _serve(repository, "--log", str(log))
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0 and "Traceback" not in out
    assert out.startswith("Error: tritonserver exited with code") and f"({log}):" in out
    assert "model dflash: CheckpointError" in out and "publish` again" in out  # the reason, from the log
    assert len(out.splitlines()) <= 4
