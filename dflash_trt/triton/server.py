"""Find, start and stop `tritonserver` (a system install, or the binary in the nvidia-pytriton wheel).

The wheel recipe (tritonserver 2.51 as nvidia-pytriton 0.7.0 ships it, which runs without a GPU): copy
`site-packages/pytriton/tritonserver` to a private folder, put the Python stub of this
interpreter's version into `backends/python/`, run with `LD_LIBRARY_PATH` = the wheel's
`nvidia_pytriton.libs` + this interpreter's LIBDIR (else `import ssl` breaks inside models) and
the virtualenv's `bin` first on PATH (the stub finds numpy, torch and dflash_trt through it).
Servers bind to 127.0.0.1 unless asked otherwise.

The server loads the repository's models explicitly (`--model-control-mode=explicit`): every folder
with a config.pbtxt whose name is not hidden, so a leftover `.dflash.tmp-*` of an interrupted publish
(older versions wrote them inside the repository) is reported and ignored instead of failing the
start; explicit control is also what lets a supervisor reload one model. On Linux the server gets
SIGTERM when the thread that started it dies (`setpriv --pdeathsig`), so a killed `dflash-trt serve`
leaves no orphan.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.errors import MissingDependencyError, ServerStartError

CACHE = Path(os.environ.get("DFLASH_TRT_CACHE", Path.home() / ".cache" / "dflash-trt"))
SYSTEM_PATHS = ("/opt/tritonserver/bin/tritonserver",)


@dataclass
class ServerBinary:
    executable: Path
    backend_dir: Path | None
    env: dict[str, str]
    origin: str  # "system" | "pytriton"


def _site_packages() -> Path | None:
    try:
        import pytriton
    except ImportError:
        return None
    return Path(pytriton.__file__).resolve().parent.parent


def _pytriton_binary() -> ServerBinary | None:
    sp = _site_packages()
    if sp is None or not (sp / "pytriton" / "tritonserver" / "bin" / "tritonserver").is_file():
        return None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    src = sp / "pytriton" / "tritonserver"
    stub = src / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise MissingDependencyError(f"{stub}: nvidia-pytriton ships no Python backend stub for Python {version}")
    private = CACHE / f"tritonserver-py{version}"
    if not (private / "backends" / "python" / "triton_python_backend_stub").is_file():
        tmp = private.with_name(private.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        shutil.copy2(stub, tmp / "backends" / "python" / "triton_python_backend_stub")
        shutil.rmtree(private, ignore_errors=True)
        os.replace(tmp, private)
    libs = [str(sp / "nvidia_pytriton.libs"), sysconfig.get_config_var("LIBDIR") or ""]
    env = {
        "LD_LIBRARY_PATH": os.pathsep.join([*libs, os.environ.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    return ServerBinary(private / "bin" / "tritonserver", private / "backends", env, "pytriton")


def find_tritonserver() -> ServerBinary:
    """A system tritonserver (NGC containers) if present, else the pytriton wheel's binary."""
    system = shutil.which("tritonserver") or next((p for p in SYSTEM_PATHS if Path(p).is_file()), None)
    if system:
        env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        return ServerBinary(Path(system), None, env, "system")
    binary = _pytriton_binary()
    if binary is None:
        raise MissingDependencyError(
            "tritonserver not found: install it (NGC tritonserver container) or pip install 'dflash-trt[serve]' "
            "(nvidia-pytriton ships a CPU-capable tritonserver)"
        )
    return binary


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Ports:
    http: int
    grpc: int
    metrics: int

    @classmethod
    def pick(cls, http: int | None = None, grpc: int | None = None, metrics: int | None = None) -> "Ports":
        return cls(http or free_port(), grpc or free_port(), metrics or free_port())


def repository_models(repository: Path) -> tuple[list[str], list[str]]:
    """(model folders to load, entries ignored): a model is a folder with a config.pbtxt whose name
    does not start with '.'; anything else in the repository is ignored (and reported)."""
    models, ignored = [], []
    for entry in sorted(Path(repository).iterdir()):
        if entry.is_dir() and not entry.name.startswith(".") and (entry / "config.pbtxt").is_file():
            models.append(entry.name)
        else:
            ignored.append(entry.name)
    return models, ignored


_LOAD_FAILURE = re.compile(r"failed to load '([^']+)' version \d+: (?:Internal: )?(.*?)(?:\\n|\"$)", re.M)


def start_failure_reasons(log: str, limit: int = 8) -> list[str]:
    """What made a start fail, from a tritonserver log: one line per model that failed to load
    (its Python exception without the traceback), else the error lines, else the last lines."""
    reasons = list(dict.fromkeys(f"model {m}: {why}" for m, why in _LOAD_FAILURE.findall(log)))
    if not reasons:
        reasons = [line for line in log.splitlines() if line.startswith("error:") or
                   (line.startswith("E") and "CudaDriverHelper" not in line and line[1:5].isdigit())]
    return (reasons or log.splitlines())[-limit:]


def _die_with_parent() -> list[str]:
    """A command prefix that makes the server get SIGTERM when the thread that started it dies
    (util-linux `setpriv --pdeathsig`; PR_SET_PDEATHSIG survives the exec). Empty where there is no
    setpriv: then only stop() stops it. (Not preexec_fn: forking with a callback is unsafe in a
    process with threads.)"""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "SIGTERM", "--"] if setpriv else []


def _processes():
    """(pid, stat fields after the command name, argv) of every readable process (Linux /proc)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rpartition(")")[2].split()
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        yield int(proc.name), stat, argv


def server_pids(repository: Path) -> list[int]:
    """The tritonserver processes serving `repository` (any parent)."""
    flag = f"--model-repository={Path(repository).resolve()}".encode()
    return [pid for pid, _, argv in _processes() if any(a.endswith(b"tritonserver") for a in argv[:5]) and flag in argv]


def model_processes(server_pid: int) -> dict[str, list[int]]:
    """The live Python-backend stub processes of a server, by model: its children whose command is the
    stub, its first argument `REPO/<model>/<version>/model.py`."""
    out: dict[str, list[int]] = {}
    for pid, (state, ppid, *_), argv in _processes():
        if int(ppid) == server_pid and state != "Z" and argv[0].endswith(b"triton_python_backend_stub"):
            model = Path(argv[1].decode(errors="replace")).parent.parent.name if len(argv) > 1 else "?"
            out.setdefault(model, []).append(pid)
    return out


class TritonServer:
    """A tritonserver process for one model repository; a context manager that stops it.

    `log_path` None: the server's output goes where this process's goes (inherited)."""

    def __init__(self, repository: str | Path, host: str = "127.0.0.1", ports: Ports | None = None,
                 log_path: str | Path | None = None, extra_args: tuple[str, ...] = (),
                 http_host: str | None = None):
        self.repository, self.host = Path(repository), host
        self.http_host = http_host or host  # 127.0.0.1 behind the HTTP front
        self.ports = ports or Ports.pick()
        self.log_path = Path(log_path) if log_path else None
        self.extra_args, self.process = extra_args, None
        self.env: dict[str, str] = {}  # extra environment of the server and its model processes
        self.binary = find_tritonserver()
        self.models, self.ignored = repository_models(self.repository)
        if not self.models:
            raise FileNotFoundError(f"{self.repository}: no model folders (each needs a config.pbtxt); "
                                    "run `dflash-trt publish BUNDLE REPOSITORY` first")

    def command(self) -> list[str]:
        p, h = self.ports, self.host
        cmd = [*_die_with_parent(), str(self.binary.executable), f"--model-repository={self.repository.resolve()}",
               "--model-control-mode=explicit", *(f"--load-model={m}" for m in self.models),
               f"--http-address={self.http_host}", f"--http-port={p.http}",
               f"--grpc-address={h}", f"--grpc-port={p.grpc}",
               f"--metrics-address={h}", f"--metrics-port={p.metrics}", "--allow-metrics=true",
               "--allow-gpu-metrics=false", "--exit-timeout-secs=10", *self.extra_args]
        if self.binary.backend_dir is not None:
            cmd.append(f"--backend-directory={self.binary.backend_dir}")
        return cmd

    @property
    def url(self) -> str:
        return f"{self.http_host}:{self.ports.http}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports.grpc}"

    def start(self, timeout: float = 120.0) -> "TritonServer":
        env = os.environ | self.binary.env | self.env
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab") if self.log_path else None
        try:
            self.process = subprocess.Popen(self.command(), env=env, stdout=log,
                                            stderr=subprocess.STDOUT if log else None, start_new_session=True)
        finally:
            if log is not None:
                log.close()  # the child keeps its own descriptor
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerStartError(f"tritonserver exited with code {self.process.returncode} while starting"
                                       + self._log_hint())
            try:
                with urllib.request.urlopen(f"http://{self.url}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise ServerStartError(f"tritonserver not ready after {timeout:.0f} s" + self._log_hint())

    def model_processes(self) -> dict[str, list[int]]:
        """The live model processes of this server, by model (`model_processes`)."""
        return {} if self.process is None else model_processes(self.process.pid)

    def _log_hint(self) -> str:
        """The reason, from the server's log: each model's load error, else its error lines."""
        if self.log_path is None:
            return " (its output is above)"
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"; log: {self.log_path}"
        return f" ({self.log_path}):\n" + "\n".join("  " + r for r in start_failure_reasons(text))

    def stop(self, timeout: float = 20.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)  # the server alone: it finalizes its model stubs itself
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._kill_group()
            self.process.wait()
        self._kill_group()  # a stub the server left behind

    def _kill_group(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
