"""CUDA kernels of dflash-trt and the one switch that picks them, their C++ twin or the torch reference.

`select(device)` chooses the verification and sampling bodies once, when a backend builds its runners
(`Kernels`): the DFlash verification plugin's kernel (plugins/dflash_verify) on CUDA when its torch op
is built and loaded, the kernels' C++ twin for sampled rows on CPU, the torch reference otherwise.
`verify_block` / `sample_tokens` make the same choice per call (the TensorRT-LLM runner's path).
Tests force a body with ``DFLASH_TRT_VERIFY_IMPL`` or `dflash_trt.kernels.verify.use_impl`.
Importing this package never touches CUDA or compiles anything.
"""

from dflash_trt.kernels.verify import (
    Kernels,
    kernel_available,
    kernel_status,
    next_block_ids,
    resolve_impl,
    sample_tokens,
    select,
    selected_impl,
    twin_available,
    use_impl,
    verify_block,
    verify_block_next,
)

__all__ = [
    "Kernels",
    "kernel_available",
    "kernel_status",
    "next_block_ids",
    "resolve_impl",
    "sample_tokens",
    "select",
    "selected_impl",
    "twin_available",
    "use_impl",
    "verify_block",
    "verify_block_next",
]
