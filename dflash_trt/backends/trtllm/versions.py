"""Pinned versions of the GPU stacks, lazy imports with clear errors, installed-version probes.

The one place that knows which TensorRT-LLM / TensorRT a bundle needs and how to install them.
`require(module, purpose)` imports a module or raises `MissingDependencyError` naming the package,
the pinned version and the install command. Probes never import a heavy package: versions come
from package metadata. A module set to None in `sys.modules` counts as absent (how tests simulate
a machine without it).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sys

from dflash_trt.errors import MissingDependencyError

TRTLLM_ENGINE_VERSION = "1.2.1"  # route A: last stable release with the TensorRT-engine backend
TENSORRT_SERIES = "10.14"  # TensorRT-LLM 1.2.1 pins tensorrt~=10.14.1
TRTLLM_LLMAPI_MIN = "1.3.0rc27"  # route B: first release we found documenting DFlashDecodingConfig
# The first NGC Triton image with TensorRT-LLM 1.2.1 (TensorRT 10.14.1.48, CUDA 13.1): 26.04 (triton-inference-server
# server docs/introduction/compatibility.md; 25.12-26.02 carry 1.1.0 / TensorRT 10.13.3, 26.03 carries 1.2.0)
CONTAINER = "nvcr.io/nvidia/tritonserver:26.04-trtllm-python-py3"

PINS = {
    "tensorrt_llm": f"tensorrt-llm=={TRTLLM_ENGINE_VERSION}",
    "tensorrt": f"tensorrt~={TENSORRT_SERIES}.1 (cu13)",
    "onnx": "onnx>=1.16",
    "onnxruntime": "onnxruntime>=1.18",
    "modelopt": "nvidia-modelopt",
}
INSTALL = {
    "tensorrt_llm": (f"pip install 'tensorrt-llm=={TRTLLM_ENGINE_VERSION}' --extra-index-url https://pypi.nvidia.com "
                     f"on a CUDA 13 machine, or run inside {CONTAINER}"),
    "tensorrt": (f"pip install 'tensorrt-cu13~={TENSORRT_SERIES}.1' --extra-index-url https://pypi.nvidia.com "
                 f"(TensorRT-LLM {TRTLLM_ENGINE_VERSION} installs it)"),
    "onnx": "pip install 'dflash-trt[dev]' (or: pip install onnx)",
    "onnxruntime": "pip install 'dflash-trt[dev]' (or: pip install onnxruntime)",
    "modelopt": "pip install nvidia-modelopt",
}
DISTRIBUTIONS = {  # module -> distribution names to ask importlib.metadata, in order
    "tensorrt_llm": ("tensorrt_llm", "tensorrt-llm"),
    "tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt_cu13_libs"),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "modelopt": ("nvidia-modelopt",),
    "torch": ("torch",),
}


def blocked(module: str) -> bool:
    """True when `sys.modules[module]` is None: imports of it fail (tests simulate absence so)."""
    return module in sys.modules and sys.modules[module] is None


def present(module: str) -> bool:
    """Is `module` importable? (no import happens)"""
    if blocked(module):
        return False
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def installed_version(module: str) -> str | None:
    """The installed version of the package providing `module`, from metadata; None if absent."""
    if not present(module):
        return None
    for dist in DISTRIBUTIONS.get(module, (module,)):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def missing_message(module: str, purpose: str) -> str:
    return f"{purpose} needs {module} ({PINS.get(module, module)}), which is not installed; {INSTALL.get(module, '')}"


def require(module: str, purpose: str):
    """Import `module` or raise MissingDependencyError naming the package, version and install command."""
    if blocked(module):
        raise MissingDependencyError(missing_message(module, purpose))
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(missing_message(module, purpose)) from None


def version_tuple(version: str) -> tuple:
    """'1.3.0rc27' -> (1, 3, 0, -1, 27): a release sorts after its release candidates."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        return (0,)
    pre = v.pre or ("z", 0)
    return (*v.release, 0 if pre[0] == "z" else -1, pre[1])


def serves_engine_route(version: str | None) -> bool:
    """TensorRT-LLM 1.2.x builds and runs TensorRT engines (route A, pinned to 1.2.1); 1.3.0rc20 was the last
    release candidate with the TensorRT backend (its release notes), removed after it (PR #15918)."""
    return version is not None and version.split(".")[:2] == ["1", "2"]


def serves_llmapi_route(version: str | None) -> bool:
    """Does this TensorRT-LLM have DFlashDecodingConfig (route B)?"""
    return version is not None and version_tuple(version) >= version_tuple(TRTLLM_LLMAPI_MIN)


def require_engine_route(purpose: str) -> None:
    """Route A runs on the pinned TensorRT-LLM / TensorRT only: other releases lack the engine backend
    (>= 1.3 after rc20) or load engines of another TensorRT; say which, before any work."""
    trtllm, trt = installed_version("tensorrt_llm"), installed_version("tensorrt")
    if trtllm is not None and not serves_engine_route(trtllm):
        raise MissingDependencyError(
            f"{purpose} needs TensorRT-LLM {TRTLLM_ENGINE_VERSION} (route A, TensorRT engines), but {trtllm} is "
            f"installed: its TensorRT engine backend is gone or not the pinned one; install "
            f"tensorrt-llm=={TRTLLM_ENGINE_VERSION} or run inside {CONTAINER} (route B serves newer releases: "
            "dflash-trt export trtllm-llmapi)")
    if trt is not None and trt != "unknown" and not trt.startswith(TENSORRT_SERIES):
        raise MissingDependencyError(f"{purpose} needs TensorRT {TENSORRT_SERIES} (TensorRT-LLM "
                                     f"{TRTLLM_ENGINE_VERSION}'s pin), but {trt} is installed; {INSTALL['tensorrt']}")


def check_recorded(recorded: dict, where: str) -> None:
    """Refuse to load engines built under another TensorRT-LLM / TensorRT than the installed one."""
    for module in ("tensorrt_llm", "tensorrt"):
        built, now = recorded.get(module), installed_version(module)
        if built and now and built != now:
            raise MissingDependencyError(
                f"{where}: engines were built with {module} {built} but {now} is installed; engines load only "
                f"under the version that built them: install {module}=={built} or rebuild the bundle"
            )
