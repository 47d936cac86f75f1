"""The CPU twin of the verify plugin: the kernels' own C++ code, compiled for the host.

- `verify_block`, `sample_tokens`, `keep_mask`, `gumbel`, ...: plugins/dflash_verify/twin/
  verify_twin.cpp runs `row_select.h` (the code every CUDA thread block runs) on one host thread,
  so comparing the twin with the torch reference checks the kernel's logic on a CPU-only machine.
- `emulated_verify_block_next`: twin/cta_emulator.cpp runs src/verify_kernels.cu itself, every
  CUDA thread of a block a fiber, checking the CUDA layer (loads, shuffles, histograms) too.

Both are plain `g++ -shared` libraries (see host_build.py) loaded with ctypes. Inputs are CPU
tensors with the shapes and dtypes of `dflash_trt.decoding.verify.verify_block`.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from dflash_trt import host_build

# The verify plugin's two host builds. Both use -ffp-contract=off: every a*b+c stays two roundings,
# like __fmul_rn / __fadd_rn in the kernels. The emulator needs only the CUDA toolkit's headers.
PLUGIN_DIR = Path(__file__).resolve().parents[2] / "plugins" / "dflash_verify"
HEADERS = ("include/dflash_verify/sampling_rule.h", "include/dflash_verify/verify_args.h",
           "include/dflash_verify/row_select.h", "include/dflash_verify/verify.h")
COMMON_FLAGS = ("-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Wextra", "-Werror")
TWIN = host_build.HostLibrary("libdflash_verify_twin.so", "twin/verify_twin.cpp", ("twin/verify_twin.cpp", *HEADERS),
                              (*COMMON_FLAGS, "-O2"), PLUGIN_DIR)
EMULATOR = host_build.HostLibrary("libdflash_verify_emu.so", "twin/cta_emulator.cpp",
                                  ("twin/cta_emulator.cpp", "src/verify_kernels.cu", *HEADERS),
                                  (*COMMON_FLAGS, "-O1", "-Wno-unknown-pragmas"), PLUGIN_DIR, needs_cuda_headers=True)

DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}

_p = ctypes.c_void_p
_i32, _i64 = ctypes.c_int32, ctypes.c_int64
_VERIFY = (_i32, [_p, _i32, _i32, _i32, _i32, _p, _i32, _p, _p, _p, _p, _p, _i64, _p, _p, _p, ctypes.c_char_p, _i32])
_SIGNATURES = {
    "dfv_twin_verify": _VERIFY,
    "dfv_twin_sample_rows": (None, [_p, _i32, _i64, _i32, _p, _p, _p, _p, _p, _p, _p]),
    "dfv_twin_sample_rows_streaming": (None, [_p, _i32, _i64, _i32, _p, _p, _p, _p, _p, _p]),
    "dfv_twin_gumbel_batched": (None, [ctypes.c_uint64, _i64, _p, _i32, _p]),
    "dfv_twin_keep_mask": (None, [_p, _i64, _i32, _p, _p, _p, _p]),
    "dfv_twin_gumbel": (None, [_p, _p, _p, _i64, _p]),
    "dfv_twin_log_f32": (None, [_p, _i64, _p]),
    "dfv_twin_log_normal": (None, [_p, _i64, _p]),
    "dfv_twin_exp_neg": (None, [_p, _i64, _p]),
}


@functools.cache
def library() -> ctypes.CDLL:
    """The twin library (built on first use)."""
    return host_build.load(TWIN, _SIGNATURES)


@functools.cache
def emulator() -> ctypes.CDLL:
    """The CTA emulator library (built on first use; needs the CUDA headers)."""
    return host_build.load(EMULATOR, {"dfv_emu_verify": _VERIFY})


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _prep(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    assert t.device.type == "cpu", f"the twin runs on CPU tensors, got {t.device}"
    return t.to(dtype).contiguous()


def _verify(fn, logits, drafts, start, temperature, top_k, top_p, seed, mask_token_id):
    assert logits.dim() == 3 and logits.dtype in DTYPES, f"logits must be [B, K+1, V] float, got {logits.shape}"
    b, width, vocab = logits.shape
    assert drafts.shape == (b, width - 1), f"drafts must be [B, K] = {(b, width - 1)}, got {tuple(drafts.shape)}"
    logits = _prep(logits, logits.dtype)
    drafts = _prep(drafts, torch.int32 if drafts.dtype == torch.int32 else torch.int64)
    args = [_prep(start, torch.int64), _prep(temperature, torch.float32), _prep(top_k, torch.int64),
            _prep(top_p, torch.float32), _prep(seed, torch.int64)]
    for a in args:
        assert a.shape == (b,), f"per-request tensors must be [B] = ({b},), got {tuple(a.shape)}"
    tokens = torch.empty(b, width, dtype=torch.int64)
    accepted = torch.empty(b, dtype=torch.int64)
    next_ids = torch.empty(b, width, dtype=torch.int64)
    err = ctypes.create_string_buffer(256)
    rc = fn(_ptr(logits), DTYPES[logits.dtype], b, width, vocab, _ptr(drafts), drafts.element_size(),
            *(_ptr(a) for a in args), mask_token_id, _ptr(tokens), _ptr(accepted), _ptr(next_ids), err, len(err))
    if rc != 0:
        raise ValueError(f"verify twin rejected its arguments: {err.value.decode()}")
    return tokens, accepted, next_ids


def verify_block_next(
    logits: torch.Tensor,  # [B, K+1, V] fp32 / fp16 / bf16
    drafts: torch.Tensor,  # [B, K] int32 / int64
    start: torch.Tensor,  # [B] int64
    temperature: torch.Tensor,  # [B] fp32
    top_k: torch.Tensor,  # [B] int64
    top_p: torch.Tensor,  # [B] fp32
    seed: torch.Tensor,  # [B] int64 (uint64 bits)
    mask_token_id: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens [B, K+1], accepted [B] and next_block_ids [B, K+1] = [t_a, mask x K] (int64)."""
    return _verify(library().dfv_twin_verify, logits, drafts, start, temperature, top_k, top_p, seed, mask_token_id)


def emulated_verify_block_next(logits, drafts, start, temperature, top_k, top_p, seed, mask_token_id: int = 0):
    """`verify_block_next` through the CUDA kernels themselves, on emulated thread blocks (slow:
    each CUDA thread a fiber on one host thread; for tests)."""
    return _verify(emulator().dfv_emu_verify, logits, drafts, start, temperature, top_k, top_p, seed, mask_token_id)


def verify_block(logits, drafts, start, temperature, top_k, top_p, seed):
    """Same signature and results as `dflash_trt.decoding.verify.verify_block`: (tokens, accepted)."""
    tokens, accepted, _ = verify_block_next(logits, drafts, start, temperature, top_k, top_p, seed)
    return tokens, accepted


def sample_tokens(logits, positions, temperature, top_k, top_p, seed, ids=None, streaming: bool = False) -> torch.Tensor:
    """Twin of `dflash_trt.decoding.sampling.sample_tokens`: logits [N, V] -> tokens [N] int64 (columns).

    `ids` [V] (ascending): the token id of each column, whose noise it gets (a draft vocabulary in id order).
    Sampled rows take the batched path (each row's noise in one vectorized loop); `streaming` runs the
    per-element rule the CUDA kernels run instead (tests compare the two; no `ids` there)."""
    assert logits.dim() == 2 and logits.dtype in DTYPES
    n, vocab = logits.shape
    logits = _prep(logits, logits.dtype)
    args = [_prep(positions, torch.int64), _prep(temperature, torch.float32), _prep(top_k, torch.int64),
            _prep(top_p, torch.float32), _prep(seed, torch.int64)]
    out = torch.empty(n, dtype=torch.int64)
    if streaming:
        assert ids is None, "the streaming rule scores columns 0..V-1"
        library().dfv_twin_sample_rows_streaming(_ptr(logits), DTYPES[logits.dtype], n, vocab,
                                                 *(_ptr(a) for a in args), _ptr(out))
        return out
    if ids is not None:
        ids = _prep(ids, torch.int64)
        assert ids.shape == (vocab,)
    library().dfv_twin_sample_rows(_ptr(logits), DTYPES[logits.dtype], n, vocab, *(_ptr(a) for a in args),
                                   _ptr(ids), _ptr(out))
    return out


def gumbel_batched(seed: int, position: int, ids: torch.Tensor) -> torch.Tensor:
    """g(seed, position, ids) by the batched path sampled rows take -> fp32 [N]."""
    ids = _prep(ids, torch.int64)
    out = torch.empty(ids.numel(), dtype=torch.float32)
    library().dfv_twin_gumbel_batched(seed & (2**64 - 1), position, _ptr(ids), ids.numel(), _ptr(out))
    return out


def keep_mask(logits, temperature, top_k, top_p) -> torch.Tensor:
    """Twin of `survivors(logits / T, top_k, top_p)` for fp32 logits [N, V], T > 0: bool [N, V]."""
    logits = _prep(logits, torch.float32)
    n, vocab = logits.shape
    args = [_prep(temperature, torch.float32), _prep(top_k, torch.int64), _prep(top_p, torch.float32)]
    keep = torch.empty(n, vocab, dtype=torch.uint8)
    library().dfv_twin_keep_mask(_ptr(logits), n, vocab, *(_ptr(a) for a in args), _ptr(keep))
    return keep.bool()


def _elementwise(name: str, x: torch.Tensor) -> torch.Tensor:
    x = _prep(x, torch.float32)
    out = torch.empty_like(x)
    getattr(library(), name)(_ptr(x), x.numel(), _ptr(out))
    return out


def log_f32(x: torch.Tensor) -> torch.Tensor:
    return _elementwise("dfv_twin_log_f32", x)


def log_normal(x: torch.Tensor) -> torch.Tensor:
    """The batched sampling path's log of positive normal floats (frexp on the bits, no branch)."""
    return _elementwise("dfv_twin_log_normal", x)


def exp_neg(x: torch.Tensor) -> torch.Tensor:
    return _elementwise("dfv_twin_exp_neg", x)


def gumbel(seed: torch.Tensor, position: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """Elementwise g(seed, position, vocab) over equal-shaped int64 tensors -> fp32."""
    seed, position, vocab = (_prep(t, torch.int64) for t in torch.broadcast_tensors(seed, position, vocab))
    out = torch.empty(seed.shape, dtype=torch.float32)
    library().dfv_twin_gumbel(_ptr(seed), _ptr(position), _ptr(vocab), seed.numel(), _ptr(out))
    return out
