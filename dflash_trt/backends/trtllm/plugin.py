"""The DFlash verification plugin as TensorRT sees it: registration metadata and library loading.

The plugin itself (IPluginV3 "DFlashVerify" version "1", empty namespace) is built from
plugins/dflash_verify/tensorrt by CMake into `libdflash_verify_trt.so`, which exports
`getCreators` / `setLoggerFinder` for `IPluginRegistry::loadLibrary`. This module is the Python
side of that contract: the creator's name, version, fields and I/O order (checked against the C++
header by a CPU test), where the library is found, and how it is registered in a process (before
a network using it is built, and before an engine containing it is deserialized).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from pathlib import Path

from dflash_trt.backends.trtllm.versions import require
from dflash_trt.errors import MissingDependencyError

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
LIBRARY_NAME = "libdflash_verify_trt.so"
LIBRARY_ENV = "DFLASH_TRT_PLUGIN_LIB"
SEARCH = (REPO_ROOT / "plugins" / "dflash_verify" / "build" / LIBRARY_NAME,)
BUILD_HINT = ("cmake -S plugins/dflash_verify -B plugins/dflash_verify/build -DTENSORRT_ROOT=<TensorRT> "
              "-DDFLASH_VERIFY_REQUIRE_TRT=ON && "
              "cmake --build plugins/dflash_verify/build -j (docs/verify-plugin.md)")


@dataclass(frozen=True)
class PluginSpec:
    name: str
    version: str
    namespace: str
    fields: tuple[tuple[str, str], ...]  # (field name, PluginFieldType name)
    inputs: tuple[tuple[str, str], ...]  # (tensor, shape and dtype) in binding order
    outputs: tuple[tuple[str, str], ...]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["fields"] = [{"name": n, "type": t} for n, t in self.fields]
        d["inputs"] = [{"name": n, "shape": s} for n, s in self.inputs]
        d["outputs"] = [{"name": n, "shape": s} for n, s in self.outputs]
        return d


DFLASH_VERIFY = PluginSpec(
    name="DFlashVerify",
    version="1",
    namespace="",
    fields=(("mask_token_id", "INT64"),),
    inputs=(
        ("logits", "[B, K+1, V] fp32/fp16/bf16"),
        ("drafts", "[B, K] int32/int64"),
        ("start", "[B] int32/int64"),
        ("temperature", "[B] fp32"),
        ("top_k", "[B] int32/int64"),
        ("top_p", "[B] fp32"),
        ("seed", "[B] int64"),
    ),
    outputs=(
        ("tokens", "[B, K+1] ids type of drafts"),
        ("accepted", "[B] int32"),
        ("next_block_ids", "[B, K+1] ids type of drafts"),
    ),
)


def find_library(explicit: str | Path | None = None, required: bool = True) -> Path | None:
    """The plugin library: an explicit path, $DFLASH_TRT_PLUGIN_LIB, or the CMake build folder."""
    candidates = [Path(explicit)] if explicit else []
    if os.environ.get(LIBRARY_ENV):
        candidates.append(Path(os.environ[LIBRARY_ENV]))
    candidates += list(SEARCH)
    for path in candidates:
        if path.is_file():
            return path.resolve()
    if required:
        tried = ", ".join(str(p) for p in candidates)
        raise MissingDependencyError(f"the DFlashVerify TensorRT plugin library ({LIBRARY_NAME}) was not found "
                                     f"(tried {tried}); build it: {BUILD_HINT}, or set ${LIBRARY_ENV}")
    return None


def register(library: str | Path) -> object:
    """Load the library into TensorRT's process-global plugin registry; returns the creator."""
    trt = require("tensorrt", "loading the DFlashVerify plugin")
    registry = trt.get_plugin_registry()
    if registry.load_library(str(library)) is None:  # None: the library could not be loaded
        raise MissingDependencyError(f"{library}: TensorRT could not load this plugin library (built against "
                                     f"another TensorRT, or a CUDA runtime is missing); rebuild it: {BUILD_HINT}")
    creator = registry.get_creator(DFLASH_VERIFY.name, DFLASH_VERIFY.version, DFLASH_VERIFY.namespace)
    if creator is None:
        raise MissingDependencyError(f"{library}: loaded, but TensorRT has no creator {DFLASH_VERIFY.name} "
                                     f"v{DFLASH_VERIFY.version}; rebuild it against this TensorRT: {BUILD_HINT}")
    return creator
