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
from dflash_trt.runtime.build import build
from dflash_trt.triton.repository import publish
from dflash_trt.triton.server import Ports, model_processes, server_pids

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # `dflash-trt serve` processes, killed and restarted


@pytest.fixture(scope="module")
def repo(tmp_path_factory, tiny_pair):
    root = tmp_path_factory.mktemp("serve")
    data = {"name": "tiny-random", "target": str(tiny_pair[0]), "draft": str(tiny_pair[1]), "backend": "torch",
            "dtype": "fp32", "block_size": 4, "runtime": {"device": "cpu", "max_batch_size": 2, "max_seq_len": 64},
            "golden": {"prompts": [{"token_ids": [1, 2, 3]}], "max_new_tokens": 4}, "output": "bundle"}
    (root / "cfg.yaml").write_text(yaml.safe_dump(data))
    bundle, _, _ = build(load_build_config(root / "cfg.yaml"), log=lambda m: None)
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
        (server,) = server_pids(repository)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 30
        while server_pids(repository) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert server_pids(repository) == [], "tritonserver outlived a killed `dflash-trt serve`"
    finally:
        for pid in server_pids(repository):
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


@pytest.fixture(scope="module")
def shipped_repo(tmp_path_factory):
    from dataclasses import replace

    root = tmp_path_factory.mktemp("supervised")
    cfg = load_build_config(Path(__file__).resolve().parents[1] / "build_configs" / "tiny-cpu.yaml")
    bundle, _, _ = build(replace(cfg, output=str(root / "bundle")), log=lambda m: None)
    return publish(bundle, root / "repo")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _kill_model_process(repository: Path, model: str) -> int:
    (server,) = server_pids(repository)
    (pid,) = model_processes(server)[model]
    os.kill(pid, signal.SIGKILL)
    return pid


def _metric(ports: Ports, name: str, model: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{ports.metrics}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name) and f'model="{model}"' in line:
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} for {model} not on the metrics port")


def _generate_soon(ports: Ports, deadline_s: float, **inputs):
    """The first request that succeeds before the deadline (the server may be restarting)."""
    from dflash_trt.errors import RequestError
    from dflash_trt.triton.client import grpc_generate, request_inputs

    deadline, last = time.monotonic() + deadline_s, None
    while time.monotonic() < deadline:
        try:
            return grpc_generate(f"127.0.0.1:{ports.grpc}", request_inputs("def f(x):", **inputs), timeout=30)
        except (RequestError, OSError, Exception) as exc:  # noqa: BLE001 - connection refused while it restarts
            last = exc
            time.sleep(0.5)
    raise AssertionError(f"no successful request within {deadline_s} s: {last!r}")


def test_a_killed_model_process_or_server_is_restarted_and_in_flight_requests_end(shipped_repo):
    """kill -9 of a model process: the request in flight ends with an error (no hang), the server is
    back within 30 s and counts the restart; kill -9 of the server itself: back again."""
    import threading

    from dflash_trt.triton.client import grpc_generate, request_inputs

    proc, ports = _serve(shipped_repo)
    try:
        _read_until(proc, "ready:")
        first = threading.Event()
        outcome: dict = {}

        def in_flight():
            try:
                grpc_generate(f"127.0.0.1:{ports.grpc}", request_inputs("import os\n", max_tokens=480, stream=True),
                              on_text=lambda delta: first.set(), timeout=60, model="dflash_ar")
                outcome["result"] = "finished"
            except Exception as exc:  # noqa: BLE001 - what the client sees is the point
                outcome["result"] = f"error: {exc}"
            first.set()

        thread = threading.Thread(target=in_flight)
        thread.start()
        assert first.wait(60)
        killed_at = time.monotonic()
        _kill_model_process(shipped_repo, "dflash_ar")
        thread.join(timeout=40)
        assert not thread.is_alive(), "the in-flight request hung"
        assert outcome["result"].startswith("error"), outcome
        result = _generate_soon(ports, 30, max_tokens=8)
        assert result.token_ids and time.monotonic() - killed_at < 30
        assert _metric(ports, "dflash_server_restarts_total", "dflash") == 1.0
        (server,) = server_pids(shipped_repo)
        stubs = [pid for pids in model_processes(server).values() for pid in pids]
        os.kill(server, signal.SIGKILL)
        assert _generate_soon(ports, 30, max_tokens=8).token_ids
        deadline = time.monotonic() + 15  # the killed server's model processes end with it (exit_with_parent)
        while [pid for pid in stubs if _alive(pid)] and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not [pid for pid in stubs if _alive(pid)], "model processes outlived their server"
        assert _metric(ports, "dflash_server_restarts_total", "dflash_ar") == 2.0
        assert proc.poll() is None  # serve itself kept running
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        for pid in server_pids(shipped_repo):
            os.kill(pid, signal.SIGKILL)


DEEP = b'{"text_input": ' + b"[" * 150_000 + b"]" * 150_000 + b"}"


def _post_raw(port: int, path: str, raw: bytes) -> int | str:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=raw)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return type(exc).__name__


def test_deep_json_kills_bare_tritonserver_but_not_serve(repo):
    """Why the front exists: tritonserver 2.51's JSON parser crashes (SIGSEGV) on ~300 KB of nesting."""
    from dflash_trt.triton.server import TritonServer

    bare = TritonServer(repo)
    if bare.binary.origin == "pytriton":  # the measured 2.51; a system server may be newer
        bare.start(timeout=180)
        try:
            _post_raw(bare.ports.http, "/v2/models/dflash/generate", DEEP)
            bare.process.wait(timeout=30)
            assert bare.process.returncode == -signal.SIGSEGV
        finally:
            bare.stop()
    proc, ports = _serve(repo)
    try:
        _read_until(proc, "ready:")
        for path in ("/v2/models/dflash/generate", "/v2/models/dflash/infer", "/v2/repository/index"):
            assert _post_raw(ports.http, path, DEEP) == 400
        assert _post_raw(ports.http, "/v2/models/dflash/generate", b'{"input_ids": [1, 2], "max_tokens": 2}') == 200
        assert proc.poll() is None and len(server_pids(repo)) == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
