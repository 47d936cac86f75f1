"""CUDA kernels of dflash-trt and the switch that picks them or their torch reference.

`verify_block` is the drop-in for `dflash_trt.decoding.verify.verify_block`: on CUDA tensors it runs
the DFlash verification plugin's kernel (plugins/dflash_verify) when its torch op is built and
loaded, and the torch reference otherwise. `kernel_available()` says which; tests force a body
with ``DFLASH_TRT_VERIFY_IMPL`` or `dflash_trt.kernels.verify.use_impl`. Importing this package
never touches CUDA or compiles anything.
"""

from dflash_trt.kernels.verify import (
    kernel_available,
    kernel_status,
    next_block_ids,
    resolve_impl,
    sample_tokens,
    selected_impl,
    twin_available,
    use_impl,
    verify_block,
    verify_block_next,
)

__all__ = [
    "kernel_available",
    "kernel_status",
    "next_block_ids",
    "resolve_impl",
    "sample_tokens",
    "selected_impl",
    "twin_available",
    "use_impl",
    "verify_block",
    "verify_block_next",
]
