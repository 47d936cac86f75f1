"""What this machine has for the GPU routes and the CPU backend (`dflash-trt doctor`): found / missing,
and what to install. It probes every layer (backends, kernels, the Triton server), so it lives with the CLI.

Each probe returns rows {component, status, version, detail, fix}; status is `ok`, `missing` or
`warn` (present but not what a route needs). Nothing heavy is imported: package versions come
from metadata, the GPU from `nvidia-smi` (or torch's CUDA runtime when nvidia-smi is absent).
Commands run through `run` (a test seam) with a timeout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from dflash_trt.backends.trtllm import versions
from dflash_trt.backends.trtllm.versions import INSTALL, TENSORRT_SERIES, TRTLLM_ENGINE_VERSION, TRTLLM_LLMAPI_MIN
from dflash_trt.errors import MissingDependencyError

NVIDIA_DRIVER = "install the NVIDIA driver (CUDA 13 needs >= 580) on a machine with an NVIDIA GPU"
CUDA_TOOLKIT = "install the CUDA 13 toolkit (nvcc) or use an NGC container; needed to build plugins/dflash_verify"
TRITON = "pip install 'dflash-trt[serve]' (nvidia-pytriton ships tritonserver) or use an NGC tritonserver container"


def run(command: list[str], timeout: float = 10.0) -> str | None:
    """stdout of a command, or None if it is absent, fails or hangs."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def row(component: str, status: str, version: str | None = None, detail: str = "", fix: str = "") -> dict:
    return {"component": component, "status": status, "version": version or "", "detail": detail, "fix": fix}


def capability_notes(major: int, minor: int) -> str:
    cc = (major, minor)
    notes = ["fp8" if cc >= (8, 9) else "no fp8", "nvfp4" if cc >= (10, 0) else "no nvfp4",
             "DFlash attention TRTLLM" if cc in ((10, 0), (10, 3)) else "DFlash attention VANILLA"]
    return ", ".join(notes)


def gpu_query() -> tuple[str, tuple[int, int], str] | None:
    """(name, compute capability, driver) of the first visible GPU, from nvidia-smi; None without one."""
    out = run(["nvidia-smi", "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"])
    if not (out and out.strip()):
        return None
    name, cap, driver = [p.strip() for p in out.strip().splitlines()[0].split(",")][:3]
    major, minor = (int(x) for x in cap.split("."))
    return name, (major, minor), driver


def probe_gpu() -> list[dict]:
    gpu = gpu_query()
    header = run(["nvidia-smi"]) or ""
    if gpu is not None:
        name, (major, minor), driver = gpu
        cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
        return [row("gpu", "ok", name, f"driver {driver}"),
                row("compute capability", "ok", f"sm{major}{minor}", capability_notes(major, minor)),
                row("cuda (driver)", "ok" if cuda else "warn", cuda.group(1) if cuda else None,
                    "" if cuda else "nvidia-smi did not report a CUDA version")]
    return [row("gpu", "missing", detail="nvidia-smi not found or no GPU visible", fix=NVIDIA_DRIVER),
            row("compute capability", "missing", fix=NVIDIA_DRIVER), row("cuda (driver)", "missing", fix=NVIDIA_DRIVER)]


def probe_nvcc() -> list[dict]:
    out = run(["nvcc", "--version"])
    if out is None:
        return [row("nvcc", "missing", fix=CUDA_TOOLKIT)]
    release = re.search(r"release ([\d.]+)", out)
    return [row("nvcc", "ok", release.group(1) if release else "unknown", shutil.which("nvcc") or "")]


def probe_torch() -> list[dict]:
    version = versions.installed_version("torch")
    if version is None:
        return [row("torch", "missing", fix="pip install dflash-trt")]
    detail = "CUDA build" if "+cpu" not in version else "CPU build (GPU routes need a CUDA build)"
    return [row("torch", "ok", version, detail)]


def probe_tensorrt() -> list[dict]:
    version = versions.installed_version("tensorrt")
    if version is None:
        return [row("tensorrt", "missing", detail="route A (paired engines)", fix=INSTALL["tensorrt"])]
    ok = version.startswith(TENSORRT_SERIES)
    return [row("tensorrt", "ok" if ok else "warn", version, "route A" if ok else
                f"route A engines are pinned to TensorRT {TENSORRT_SERIES}", "" if ok else INSTALL["tensorrt"])]


def probe_trtllm() -> list[dict]:
    version = versions.installed_version("tensorrt_llm")
    if version is None:
        return [row("tensorrt_llm", "missing", detail="route A needs 1.2.1; route B (llmapi DFlash) needs "
                    f">={TRTLLM_LLMAPI_MIN}", fix=INSTALL["tensorrt_llm"])]
    routes = [name for name, ok in (("A: paired engines", versions.serves_engine_route(version)),
                                    ("B: native DFlash", versions.serves_llmapi_route(version))) if ok]
    exact = version == TRTLLM_ENGINE_VERSION or versions.serves_llmapi_route(version)
    rows = [row("tensorrt_llm", "ok" if exact else "warn", version,
                "serves route " + " and ".join(routes) if routes else "serves neither route",
                "" if exact else INSTALL["tensorrt_llm"])]
    if versions.serves_llmapi_route(version):
        rows.append(row("prefix cache (route B)", "warn", version,
                        "TensorRT-LLM's DFlash drafter loses a reused prefix's context: a prefix-cache hit skips the "
                        "target's prefill but lowers acceptance (dflash.py, _store_prefill_context); the export keeps "
                        "enable_block_reuse off unless --kv-block-reuse",
                        "for chains with shared prompts, the torch backend keeps the drafter's context per block"))
    return rows


def probe_tritonserver() -> list[dict]:
    from dflash_trt.triton.server import find_tritonserver

    try:
        binary = find_tritonserver()
    except MissingDependencyError as exc:
        return [row("tritonserver", "missing", detail=exc.format_message(), fix=TRITON)]
    return [row("tritonserver", "ok", binary.origin, str(binary.executable))]


def probe_package(module: str, component: str, purpose: str) -> list[dict]:
    version = versions.installed_version(module)
    if version is None:
        return [row(component, "missing", detail=purpose, fix=INSTALL[module])]
    return [row(component, "ok", version, purpose)]


def probe_plugin() -> list[dict]:
    """The plugin library, the GPUs its kernels cover, and whether this machine's GPU is one of them."""
    from dflash_trt.backends.trtllm.plugin import BUILD_HINT, find_library
    from dflash_trt.kernels import archs

    path = find_library(required=False)
    if path is None:
        return [row("DFlashVerify plugin", "missing", detail="route A target engine", fix=BUILD_HINT)]
    built, gpu = archs.library_archs(path), gpu_query()
    detail = f"{path}; kernels: {built.describe()}"
    if gpu is not None and not archs.covers(built, gpu[1]):
        return [row("DFlashVerify plugin", "missing", detail=archs.uncovered_message(str(path), built, gpu[1]),
                    fix=BUILD_HINT)]
    return [row("DFlashVerify plugin", "ok", detail=detail)]


def probe_cpu_layers() -> list[dict]:
    """The C++ decoder layer of the CPU backend (backends/cpu/layers.py): built here, or why not."""
    import os
    import warnings

    from dflash_trt.backends.cpu import ops as cpu_ops

    if os.environ.get(cpu_ops.ENV, "1") == "0":
        return [row("C++ CPU layer", "warn", detail=f"turned off ({cpu_ops.ENV}=0): CPU passes run eager torch",
                    fix=f"unset {cpu_ops.ENV}")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        handle = cpu_ops.library()
    if handle is None:
        reason = str(caught[-1].message) if caught else "not built"
        return [row("C++ CPU layer", "missing", detail=f"CPU runtime passes fall back to eager torch: {reason}",
                    fix="install g++ (apt-get install g++)")]
    return [row("C++ CPU layer", "ok", detail=handle._name)]


def diagnose() -> list[dict]:
    """Every probe's rows, in report order."""
    return [*probe_gpu(), *probe_nvcc(), *probe_torch(), *probe_tensorrt(), *probe_trtllm(), *probe_tritonserver(),
            *probe_package("modelopt", "nvidia-modelopt", "calibration with Model Optimizer (optional)"),
            *probe_package("onnx", "onnx", "draft graph export (route A)"),
            *probe_package("onnxruntime", "onnxruntime", "draft graphs on CPU (CI)"), *probe_plugin(),
            *probe_cpu_layers()]


def reserved_for_config(path: str) -> dict:
    """The bytes a trtllm build config's target executor reserves for the DFlash outputs at start
    (backends/trtllm/build.py `reserved_bytes`), or why it cannot be told (the pair is not downloaded, ...)."""
    import tempfile

    from dflash_trt.backends.trtllm.build import plan_trtllm_build, reserved_bytes
    from dflash_trt.backends.trtllm.io_spec import describe_reserved
    from dflash_trt.engine.config import load_build_config
    from dflash_trt.errors import DFlashTrtError

    try:
        cfg = load_build_config(path)
        plan = plan_trtllm_build(cfg, Path(tempfile.gettempdir()) / "dflash-trt-doctor-plan")
    except DFlashTrtError as exc:
        return {"summary": f"cannot account its outputs: {exc.format_message()}", "bytes": None}
    reserved = reserved_bytes(plan, cfg.runtime)
    return {"summary": describe_reserved(reserved), "bytes": reserved, "sampled_requests": plan.sampled}
