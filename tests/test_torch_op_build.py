"""The torch op's two sources compile with torch's own flags on a machine with no GPU and a CPU build of torch.

`python -m dflash_trt.kernels.build_op` hands plugins/dflash_verify/torch/verify_op.cpp to the host compiler
and src/verify_kernels.cu to nvcc through `torch.utils.cpp_extension.load`, which adds its own flags to each;
these tests give the same compilers the same flags, so a lent GPU's first build meets no compile error.
Linking needs a CUDA build of torch (libtorch_cuda, libc10_cuda): only scripts/gpu_check.sh links the op.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from dflash_trt import host_build
from dflash_trt.kernels import archs, build_op

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "dflash_verify"


def torch_extension_flags() -> list[str]:
    """What cpp_extension.load puts before both compilers' own flags (torch/utils/cpp_extension.py,
    _write_ninja_file_to_build_library): the extension's name, the plugin include dir, torch's and Python's."""
    includes = [*cpp_extension.include_paths(), sysconfig.get_path("include")]
    system = [flag for path in includes for flag in ("-isystem", path)]  # two words: nvcc takes no -isystem<dir>
    return ["-DTORCH_EXTENSION_NAME=dflash_verify_torch", "-DTORCH_API_INCLUDE_EXTENSION_H",
            f"-I{PLUGIN / 'include'}", *system]


@pytest.mark.slow
def test_torch_op_source_compiles_against_torchs_headers():
    """verify_op.cpp, syntax only, with torch's C++ flags (-fPIC -std=c++20, build_op's -O3) and the plugin's
    warnings as errors, against the installed torch's headers plus the CUDA toolkit's (c10/cuda needs
    cuda_runtime_api.h). A CPU wheel lacks the one header CMake generates for CUDA builds,
    c10/cuda/impl/cuda_cmake_macros.h; C10_CUDA_NO_CMAKE_CONFIGURE_FILE is torch's own switch to skip it, and
    what it would define (C10_CUDA_BUILD_SHARED_LIBS) matters to Windows DLL exports only."""
    cxx, cuda = shutil.which("g++") or shutil.which("c++"), host_build.cuda_include_dir()
    if cxx is None or cuda is None:
        pytest.skip("needs a C++ compiler and the CUDA headers (set CUDA_HOME)")
    cmd = [cxx, "-fsyntax-only", *torch_extension_flags(), "-fPIC", "-std=c++20", "-O3", "-Wall", "-Wextra",
           "-Werror", "-DC10_CUDA_NO_CMAKE_CONFIGURE_FILE", "-isystem", str(cuda),
           str(PLUGIN / "torch" / "verify_op.cpp")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.slow
def test_kernels_compile_with_torchs_extension_flags(tmp_path, monkeypatch):
    """verify_kernels.cu to an object with the nvcc flags cpp_extension.load adds (COMMON_NVCC_FLAGS: no
    half / bfloat16 operators or implicit conversions, relaxed constexpr; -fPIC; -std=c++20) and build_op's
    -O3, for the arch build_op picks on an H200, warnings as errors; the object holds that arch's cubin."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not on PATH")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", build_op.torch_arch_name("90a"))  # what build_op sets
    gencode = cpp_extension._get_cuda_arch_flags(["-O3"])  # private, but it is what load() runs
    assert gencode == ["-gencode=arch=compute_90a,code=sm_90a"]
    out = tmp_path / "verify_kernels.o"
    cmd = [nvcc, "-c", *torch_extension_flags(), *cpp_extension.COMMON_NVCC_FLAGS, *gencode,
           "--compiler-options", "-fPIC", "-O3", "-std=c++20", "-Werror", "all-warnings",
           str(PLUGIN / "src" / "verify_kernels.cu"), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert archs.library_archs(out) == archs.Archs(("90a",), ())
