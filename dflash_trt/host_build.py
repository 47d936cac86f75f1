"""Compile host-side C++ libraries with plain g++ (no torch extension, no nvcc), loaded with ctypes.

Used by the verify plugin's CPU twin and CTA emulator (kernels/twin.py) and by the C++ CPU decoder
layer (backends/cpu/ops.py). Each library is cached under ``$DFLASH_TRT_CACHE_DIR`` (default
~/.cache/dflash_trt) in a folder named by a hash of its sources and flags, so an edit to any source
rebuilds it. A bottom-level module: it imports nothing of dflash-trt but the error family.
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dflash_trt.errors import MissingDependencyError


@dataclass(frozen=True)
class HostLibrary:
    filename: str  # the .so
    main: str  # source compiled, relative to root
    sources: tuple[str, ...]  # everything hashed, relative to root
    flags: tuple[str, ...]
    root: Path  # main, sources and the include folder are relative to it
    needs_cuda_headers: bool = False
    cpu_specific: bool = False  # built with -march=native: the cache key includes this CPU's flags


def cache_home() -> Path:
    """dflash-trt's cache folder: $DFLASH_TRT_CACHE_DIR, default ~/.cache/dflash_trt."""
    return Path(os.environ.get("DFLASH_TRT_CACHE_DIR") or Path.home() / ".cache" / "dflash_trt")


def cache_root() -> Path:
    return cache_home() / "verify_host"


def cuda_include_dir() -> Path | None:
    """The CUDA toolkit's include folder (cuda_runtime.h), or None."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(str(Path(nvcc).resolve().parents[1]))
    roots += sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    for root in filter(None, roots):
        for inc in (Path(root) / "include", *Path(root).glob("targets/*/include")):
            if (inc / "cuda_runtime.h").exists() and (inc / "cuda_bf16.h").exists():
                return inc
    return None


def _cpu_flags() -> str:
    """This CPU's feature flags (/proc/cpuinfo), so a -march=native build is never reused elsewhere."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    return next((line for line in lines if line.startswith("flags")), platform.machine())


def _hash(lib: HostLibrary, extra: tuple[str, ...]) -> str:
    digest = hashlib.sha256(" ".join((*lib.flags, *extra)).encode())
    if lib.cpu_specific:
        digest.update(_cpu_flags().encode())
    for rel in lib.sources:
        digest.update(rel.encode() + b"\0" + (lib.root / rel).read_bytes())
    return digest.hexdigest()[:16]


def build(lib: HostLibrary) -> Path:
    """Compile `lib` unless a build of the same sources exists; returns the .so path."""
    if not (lib.root / lib.main).exists():
        raise MissingDependencyError(f"sources of {lib.filename} not found under {lib.root}; use a source checkout")
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise MissingDependencyError(f"no C++ compiler for {lib.filename}; install g++ (apt-get install g++)")
    includes = (f"-I{lib.root / 'include'}",)
    if lib.needs_cuda_headers:
        cuda = cuda_include_dir()
        if cuda is None:
            raise MissingDependencyError("CUDA headers not found (set CUDA_HOME); the CTA emulator needs them")
        includes += (f"-isystem{cuda}",)
    target = cache_root() / _hash(lib, includes) / lib.filename
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    cmd = [cxx, *lib.flags, *includes, str(lib.root / lib.main), "-o", tmp]
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        os.unlink(tmp)
        raise RuntimeError(f"building {lib.filename} failed:\n{' '.join(cmd)}\n{result.stderr}")
    os.replace(tmp, target)  # atomic: concurrent builders never see a half-written library
    return target


def load(lib: HostLibrary, signatures: dict[str, tuple]) -> ctypes.CDLL:
    """Build `lib` (or reuse its cached build) and load it, each function of `signatures`
    ({name: (restype, argtypes)}) typed for ctypes."""
    handle = ctypes.CDLL(str(build(lib)))
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(handle, name)
        fn.restype, fn.argtypes = restype, argtypes
    return handle
