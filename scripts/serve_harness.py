"""What scripts/fuzz_serve.py and scripts/soak_serve.py share: a real `dflash-trt serve` on loopback,
its processes and their memory, and a canary request whose tokens must never change.

Loopback only: the server binds 127.0.0.1 and every request goes there.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dflash_trt.triton.client import grpc_generate, http_generate, request_inputs  # noqa: E402
from dflash_trt.triton.server import Ports, model_processes, server_pids  # noqa: E402

CANARY = request_inputs("def parse_args(argv):\n", max_tokens=32, stream=False)


def build_repository(work: Path) -> Path:
    """The shipped pair's bundle and repository (preset tiny-cpu) under `work`, reused when unchanged."""
    from dflash_trt.engine.config import load_build_config
    from dflash_trt.runtime.build import build
    from dflash_trt.triton.repository import publish

    cfg = load_build_config(ROOT / "build_configs" / "tiny-cpu.yaml")
    bundle, _, _ = build(replace(cfg, output=str(work / "bundle")), log=lambda m: None)
    return publish(bundle, work / "repo")


class Served:
    """`dflash-trt serve REPO` on free loopback ports; its output goes to `log`."""

    def __init__(self, repository: Path, log: Path):
        self.repository, self.ports = repository, Ports.pick()
        self.log = open(log, "w")
        cmd = [sys.executable, "-m", "dflash_trt.cli", "serve", str(repository), "--http-port", str(self.ports.http),
               "--grpc-port", str(self.ports.grpc), "--metrics-port", str(self.ports.metrics)]
        self.process = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        self.wait_ready()

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.ports.http}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.ports.grpc}"

    def wait_ready(self, timeout: float = 180) -> float:
        """Seconds until a canary succeeds (the server may be restarting)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.process.poll() is not None:
                raise RuntimeError(f"dflash-trt serve exited with {self.process.returncode}; see {self.log.name}")
            try:
                grpc_generate(self.grpc, CANARY, timeout=30)
                http_generate(self.http, CANARY, timeout=30)  # the front too (it starts after the server)
                return time.monotonic() - t0
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.25)
        raise TimeoutError(f"not serving after {timeout} s")

    def server_pid(self) -> int | None:
        pids = server_pids(self.repository)
        return pids[0] if pids else None

    def model_pid(self, model: str) -> int | None:
        server = self.server_pid()
        pids = model_processes(server).get(model, []) if server is not None else []
        return pids[0] if pids else None

    def pids(self) -> dict[str, int]:
        """`dflash-trt serve` itself (its HTTP front), the server and each model process, by name."""
        out = {"serve (front)": self.process.pid}
        server = self.server_pid()
        if server is not None:
            out["tritonserver"] = server
            out |= {f"model {model}": found[0] for model, found in model_processes(server).items()}
        return out

    def rss_by_process(self) -> dict[str, int]:
        """RSS bytes of each of `pids()`."""
        return {name: _rss(pid) for name, pid in self.pids().items()}

    def rss_parts_by_process(self) -> dict[str, dict[str, int]]:
        """Each process's RSS split into anonymous, file-backed and shared-memory pages: the Python backend's
        shared-memory pool counts in both the server's and the stub's RSS as its pages get touched."""
        return {name: {part: _rss(pid, part) for part in RSS_PARTS} for name, pid in self.pids().items()}

    def rss_bytes(self) -> int:
        """The server and its model processes (what serving costs; the front is reported on its own)."""
        return sum(v for k, v in self.rss_by_process().items() if k != "serve (front)")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.log.close()


def _rss(pid: int, field: str = "VmRSS") -> int:
    try:
        return int(Path(f"/proc/{pid}/status").read_text().split(f"{field}:")[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        return 0


RSS_PARTS = ("RssAnon", "RssFile", "RssShmem")  # VmRSS = their sum (proc(5))


class RssSampler:
    """Samples the served processes' RSS every `every_s` in a thread: start, end, max."""

    def __init__(self, served: Served, every_s: float = 1.0):
        self.served, self.every_s, self.samples = served, every_s, [served.rss_bytes()]
        self.first, self.first_parts = served.rss_by_process(), served.rss_parts_by_process()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(self.every_s):
            self.samples.append(self.served.rss_bytes())

    def finish(self) -> dict:
        self.stopped.set()
        self.thread.join()
        self.samples.append(self.served.rss_bytes())
        mb = lambda b: round(b / 2**20, 1)  # noqa: E731
        last = self.served.rss_by_process()
        parts = self.served.rss_parts_by_process()
        by_process = {k: {"start_mb": mb(v), "end_mb": mb(last.get(k, 0)),
                          **{f"{part}_start_mb": mb(self.first_parts.get(k, {}).get(part, 0)) for part in RSS_PARTS},
                          **{f"{part}_end_mb": mb(parts.get(k, {}).get(part, 0)) for part in RSS_PARTS}}
                      for k, v in self.first.items()}
        return {"start_mb": mb(self.samples[0]), "end_mb": mb(self.samples[-1]), "max_mb": mb(max(self.samples)),
                "by_process": by_process, "samples_mb": [mb(s) for s in self.samples]}


def canary_tokens(served: Served) -> list[int]:
    return grpc_generate(served.grpc, CANARY, timeout=60).token_ids


def add_common_args(parser, name: str) -> None:
    """--seed, --work (bundle, repository, server log) and --out (the JSON report) of both harnesses."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=ROOT / "out" / "reliability")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "reliability" / f"{name}.json")


def write_report(path: Path, report: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


__all__ = ["Served", "RssSampler", "add_common_args", "build_repository", "canary_tokens", "write_report",
           "http_generate", "grpc_generate", "request_inputs", "os"]
