"""Build the verify torch op with torch's own extension builder (needs a CUDA build of torch + nvcc).

    python -m dflash_trt.kernels.build_op [--arch 90a] [--out plugins/dflash_verify/build/torch_ext]

Compiles plugins/dflash_verify/torch/verify_op.cpp and src/verify_kernels.cu for the visible GPU's
architecture (its arch-specific ``a`` variant) and loads the library, which registers
``torch.ops.dflash_verify.verify_block``; prints the library path. The CMake target
``dflash_verify_torch`` builds the same library; this route needs no CMake and matches torch's
compiler flags and ABI exactly. The CPU torch build cannot do this (no CUDA libraries).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from dflash_trt.errors import MissingDependencyError

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "dflash_verify"
DEFAULT_OUT = PLUGIN_DIR / "build" / "torch_ext"


def device_arch() -> str:
    """'90a' for an H100/H200, '100a' for a B200, '120a' for an RTX 50xx: the visible GPU's arch."""
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}a" if major >= 9 else f"{major}{minor}"


def torch_arch_name(arch: str) -> str:
    """'90a' -> '9.0a', '120a' -> '12.0a', '86' -> '8.6' (TORCH_CUDA_ARCH_LIST spelling)."""
    suffix = "a" if arch.endswith("a") else ""
    digits = arch.removesuffix("a")
    return f"{digits[:-1]}.{digits[-1]}{suffix}"


def build(arch: str | None = None, out_dir: Path = DEFAULT_OUT, verbose: bool = False) -> Path:
    """Compile and load the op; returns the shared library's path."""
    if torch.version.cuda is None:
        raise MissingDependencyError(
            f"torch {torch.__version__} is a CPU build; the verify op needs a CUDA build of torch")
    from torch.utils import cpp_extension

    # torch reads the arch list as "9.0a"; give it exactly this arch so it adds no other one.
    os.environ["TORCH_CUDA_ARCH_LIST"] = torch_arch_name(arch or device_arch())
    out_dir.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name="dflash_verify_torch",
        sources=[str(PLUGIN_DIR / "torch" / "verify_op.cpp"), str(PLUGIN_DIR / "src" / "verify_kernels.cu")],
        extra_include_paths=[str(PLUGIN_DIR / "include")],
        extra_cflags=["-O3"],
        extra_cuda_cflags=["-O3"],  # -Werror lives in CI (tests/test_verify_plugin.py), not here
        build_directory=str(out_dir),
        is_python_module=False,
        verbose=verbose,
    )
    return out_dir / "dflash_verify_torch.so"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", help="CUDA arch such as 90a, 100a, 120a (default: the visible GPU's)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="build folder")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() and args.arch is None:
        print("no visible CUDA device; pass --arch to build anyway", file=sys.stderr)
        return 2
    print(build(args.arch, args.out, args.verbose))
    return 0


if __name__ == "__main__":
    sys.exit(main())
