"""The C++ CPU library (cpu_kernels/decoder_layer.cpp): how it is built and loaded, its thread count
(`follow_torch_threads`), and its row-independent operations — RMSNorm, the small-row projection, packed
panels and the greedy heads.

Every op here computes each output row with the same instruction sequence whatever the row count or
thread count, so a verify row equals a one-token decode row bit for bit. Ops return None (or the caller
checks `*_ready`) when they do not apply: non-fp32 or non-CPU tensors, autograd or graph recording
(`eager`), or no library. `DFLASH_TRT_CPU_LAYERS=0` turns the library off; without a C++ compiler it is off
with one warning. It is built with g++ -O3 -march=native on first use (a few seconds) and cached
(host_build.py). The decoder layers that use it are in layers.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from dflash_trt import host_build
from dflash_trt.errors import MissingDependencyError
from dflash_trt.model.loader import cpu_threads

ENV = "DFLASH_TRT_CPU_LAYERS"

SOURCE_DIR = Path(__file__).resolve().parent / "cpu_kernels"
FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O3", "-march=native", "-pthread", "-Wall", "-Wextra", "-Werror")
PORTABLE_FLAGS = tuple(f for f in FLAGS if f != "-march=native")  # no AVX2 / FMA: the plain C++ loops

_p, _i32 = ctypes.c_void_p, ctypes.c_int32


class LayerWeights(ctypes.Structure):
    """Mirror of DflLayerWeights in decoder_layer.cpp."""

    _fields_ = [("input_norm", _p), ("qkv", _p), ("q_norm", _p), ("k_norm", _p), ("o_proj", _p),
                ("post_norm", _p), ("gate_up", _p), ("down", _p), ("hidden", _i32), ("heads", _i32),
                ("kv_heads", _i32), ("head_dim", _i32), ("intermediate", _i32), ("eps", ctypes.c_float),
                ("weight_format", _i32), ("window", _i32)]


class DraftStepArgs(ctypes.Structure):
    """Mirror of DflDraftStep in decoder_layer.cpp."""

    _fields_ = [("layers", ctypes.POINTER(ctypes.POINTER(LayerWeights))), ("n_layers", _i32), ("fc", _p), ("fc_in", _i32),
                ("hidden_norm", _p), ("hidden_eps", ctypes.c_float), ("final_norm", _p), ("final_eps", ctypes.c_float),
                ("head", _p), ("vocab", _i32), ("vocab_ids", _p), ("first", _i32)]


class SamplingArgs(ctypes.Structure):
    """Mirror of DflSampling in decoder_layer.cpp: one sampled sequence's rule for its coupled drafts."""

    _fields_ = [("sample_rows", ctypes.c_void_p), ("ids", _p), ("temperature", ctypes.c_float),
                ("top_k", ctypes.c_int64), ("top_p", ctypes.c_float), ("seed", ctypes.c_int64),
                ("position", ctypes.c_int64)]


_i64 = ctypes.c_int64
_SIGNATURES = {  # name: (restype, argtypes)
    "dfl_decoder_layer": (_i32, [ctypes.POINTER(LayerWeights), _p, _i32, _i32, _p, _p, _p, _p, _p, _p, _p, _p, _i32, _i32]),
    "dfl_decoder_layer_rows": (_i32, [ctypes.POINTER(LayerWeights), _p, _i32, _i32, _p, _p, _p, _p, _p, _p, _p, _p, _i32,
                                      _i32, _i32, _i32, _i32]),
    "dfl_matmul_nt": (None, [_p, _i32, _i32, _p, _i32, _p]),
    "dfl_pack_panels": (None, [_p, _i32, _i32, _p]),
    "dfl_matmul_panels": (None, [_p, _i32, _i32, _p, _i32, _p]),
    "dfl_rms_norm": (None, [_p, _i32, _i32, _p, ctypes.c_float, _p]),
    "dfl_greedy_verify": (_i32, [_p, _i32, _i32, _p, _i32, _p, _i32, _p]),
    "dfl_greedy_drafts": (_i32, [_p, _i32, _i32, _p, _i32, ctypes.c_float, _i32, _p]),
    "dfl_draft_step": (_i32, [ctypes.POINTER(DraftStepArgs), _p, _i32, _p, _i32, _p, _p, _p, _p, _i64, _i64, _i64, _i32,
                              ctypes.c_float, ctypes.POINTER(SamplingArgs), _p, _p]),
    "dfl_sampled_trust": (None, [_p, _i32, _i32, _p, _p, _p]),
    "dfl_sampled_verify": (_i32, [_p, _i32, _i32, _p, _i32, _p, _i32, ctypes.POINTER(SamplingArgs), _p]),
    "dfl_set_threads": (None, [_i32]),
    "dfl_threads": (_i32, []),
    "dfl_pool_jobs": (_i64, []),
}


def build_library(flags: tuple[str, ...] = FLAGS, cpu_specific: bool = True) -> ctypes.CDLL:
    """Compile (or reuse the cached build of) decoder_layer.cpp with `flags` and load it."""
    spec = host_build.HostLibrary("libdflash_cpu_layer.so", "decoder_layer.cpp", ("decoder_layer.cpp", "thread_pool.h"),
                                  flags, root=SOURCE_DIR, cpu_specific=cpu_specific)
    return host_build.load(spec, _SIGNATURES)


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled layer library, or None when turned off or not buildable (warns once)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        lib = build_library()
    except (MissingDependencyError, RuntimeError, OSError) as e:
        warnings.warn(f"C++ CPU decoder layer unavailable, using the torch path: {e}", stacklevel=2)
        return None
    follow_torch_threads(lib)
    return lib


_followed_torch_threads = 0  # torch.get_num_threads() when the library's thread count was last set


def follow_torch_threads(lib: ctypes.CDLL) -> None:
    """Give the library min(DFLASH_TRT_CPU_THREADS, torch's intra-op threads) threads when torch's count has
    changed since the last call (one cheap read: every pass calls this). The runtime sets torch's count from
    the variable (model/loader.py `resolve_device`) and TP ranks set it to 1, so the C++ passes follow both."""
    global _followed_torch_threads
    n = torch.get_num_threads()
    if n != _followed_torch_threads:
        _followed_torch_threads = n
        lib.dfl_set_threads(min(cpu_threads(), n))


@contextlib.contextmanager
def threads(n: int):
    """The library at `n` threads inside (more than the cores too: tests split work unevenly with it), then
    back to what it had. Results are the same bits at any count."""
    lib = library()
    before = lib.dfl_threads()
    lib.dfl_set_threads(n)
    try:
        yield
    finally:
        lib.dfl_set_threads(before)


def eager() -> bool:
    """Plain eager execution: no autograd, and nothing recording the graph (ONNX export, tracing,
    torch.compile) — a ctypes call is invisible to them and would be baked in as a constant."""
    return not (torch.is_grad_enabled() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
                or torch.compiler.is_compiling())


def tensor_version(t: torch.Tensor | None) -> int:
    """The in-place modification counter (an optimizer step or load_state_dict bumps it); inference
    tensors have none (0)."""
    return -1 if t is None else (0 if t.is_inference() else t._version)


def tensor_versions(tensors) -> tuple[int, ...]:
    return tuple(tensor_version(t) for t in tensors)


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> [ceil(N / 8), K, 8], the layout the layer's projections stream (zero-padded)."""
    n, k = weight.shape
    panels = torch.empty((n + 7) // 8, k, 8, dtype=torch.float32)
    library().dfl_pack_panels(weight.detach().contiguous().data_ptr(), n, k, panels.data_ptr())
    return panels


def bf16_exact(weight: torch.Tensor) -> bool:
    """Whether every value of an fp32 weight is a bf16 value (its low 16 bits zero): a bf16 / fp16
    checkpoint held in fp32 (model/loader.py `held_dtype`; fp16 values mostly are not)."""
    return weight.dtype == torch.float32 and bool((weight.detach().contiguous().view(torch.int32) & 0xFFFF).eq(0).all())


def bf16_panels(panels: torch.Tensor) -> torch.Tensor:
    """fp32 panels of bf16 values -> their bf16 bits (uint16, same layout): the layer kernel expands them
    back exactly, so its results are the same bits from half the weight stream."""
    import numpy as np

    out = torch.empty(panels.shape, dtype=torch.uint16)  # torch's allocation: aligned for 16-byte loads
    out.numpy()[...] = (panels.contiguous().numpy().view(np.uint32) >> 16).astype(np.uint16)
    return out


def fp16_exact(weight: torch.Tensor) -> bool:
    """Whether every value of an fp32 weight is a finite fp16 value (an fp16 checkpoint held in fp32)."""
    w = weight.detach()
    return weight.dtype == torch.float32 and bool(torch.isfinite(w).all()) and torch.equal(w.half().float(), w)


def fp16_panels(panels: torch.Tensor) -> torch.Tensor:
    """fp32 panels of fp16 values -> their IEEE half bits (uint16, same layout), expanded exactly by the kernel."""
    out = torch.empty(panels.shape, dtype=torch.uint16)
    out.numpy()[...] = panels.contiguous().half().numpy().view("uint16")
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """weight * x / rms(x) over the last dim through the layer's norm (contiguous fp32 CPU x and
    weight, `eager`), or None when it does not apply (one call where torch runs several ops)."""
    if not (x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()
            and weight.is_contiguous() and eager()) or library() is None:
        return None
    out = torch.empty_like(x)
    n = x.shape[-1]
    library().dfl_rms_norm(x.data_ptr(), x.numel() // n, n, weight.data_ptr(), eps, out.data_ptr())
    return out


def matmul_nt(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [R, K] @ weight[N, K]ᵀ -> [R, N] through the layer's row-independent projection (fp32 CPU, contiguous;
    the building block the layer's projections share, exposed for tests)."""
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    library().dfl_matmul_nt(x.data_ptr(), x.shape[0], x.shape[1], weight.data_ptr(), weight.shape[0], out.data_ptr())
    return out


# --- heads ----------------------------------------------------------------------------------------


def head_weight(head) -> torch.Tensor | None:
    """The weight of a head the C++ code can read: a plain bias-free nn.Linear without hooks, or a
    non-module object with a `.weight` (the draft-vocabulary head) — fp32 on CPU; else None."""
    if isinstance(head, nn.Module) and (type(head) is not nn.Linear or head.bias is not None
                                        or head._forward_hooks or head._forward_pre_hooks):
        return None
    weight = getattr(head, "weight", None)  # a plain callable has none: the caller's own path
    return weight if isinstance(weight, torch.Tensor) and weight.dtype == torch.float32 \
        and weight.device.type == "cpu" else None


def head_panels(head, weight: torch.Tensor) -> torch.Tensor:
    """`weight` packed once as panels and cached on the head (re-packed when the weight is replaced
    or modified in place)."""
    cached = head.__dict__.get("_cpu_panels")
    if cached is None or cached[0] is not weight or cached[1] != tensor_version(weight):
        cached = (weight, tensor_version(weight), pack_panels(weight))
        head.__dict__["_cpu_panels"] = cached
    return cached[2]


def head_matmul(x: torch.Tensor, head) -> torch.Tensor | None:
    """x [R, K] (fp32 CPU, contiguous) @ the weight of `head` (`head_weight`)ᵀ through its cached panels
    -> [R, N]; None when the head is not one the C++ code reads. Callers have checked `eager`."""
    weight = head_weight(head)
    if weight is None or library() is None or x.dtype != torch.float32 or not x.is_contiguous():
        return None
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    library().dfl_matmul_panels(x.data_ptr(), x.shape[0], x.shape[1], head_panels(head, weight).data_ptr(),
                                weight.shape[0], out.data_ptr())
    return out


def head_ready(hidden: torch.Tensor, head) -> bool:
    """Whether `hidden` [1, R, H] (one sequence, fp32 CPU) can go through the C++ greedy heads with
    `head` (`head_weight`, `eager`, library built)."""
    if hidden.shape[0] != 1 or hidden.dtype != torch.float32 or hidden.device.type != "cpu" or not eager():
        return False
    return head_weight(head) is not None and library() is not None


def greedy_verify(hidden: torch.Tensor, head, drafts: torch.Tensor, first: int) -> tuple[torch.Tensor, int]:
    """hidden [R, H] final-norm rows of [bonus, d_1 .. d_K], drafts [K] -> target tokens [R] (-1 after
    the first mismatch) and the accepted count: greedy `verify_lazily` for one sequence."""
    weight = head_weight(head)
    panels = head_panels(head, weight)
    hidden, drafts = hidden.contiguous(), drafts.to(torch.int64).contiguous()
    tokens = torch.full((hidden.shape[0],), -1, dtype=torch.int64)
    accepted = library().dfl_greedy_verify(hidden.data_ptr(), hidden.shape[0], hidden.shape[1], panels.data_ptr(),
                                           weight.shape[0], drafts.data_ptr(), first, tokens.data_ptr())
    return tokens, accepted


def twin_rule(sampling) -> tuple:
    """Row 0's (temperature, top_k, top_p, seed) of `sampling` ([B] tensors) as numbers: one sampled
    sequence's rule for the C++ heads, which pick with the sampling rule's C++ twin (`sampling_args`)."""
    temperature, top_k, top_p, seed = sampling
    return float(temperature[0]), int(top_k[0]), float(top_p[0]), int(seed[0])


@functools.cache
def _twin_sample_rows() -> int:
    from dflash_trt.kernels import twin  # its own build: no FMA contraction

    return ctypes.cast(twin.library().dfv_twin_sample_rows, ctypes.c_void_p).value


def sampling_args(rule: tuple, position: int, ids: torch.Tensor | None = None) -> SamplingArgs:
    """One sampled row's rule (`twin_rule`) for the C++ heads, its first token at `position`; the pick is
    the sampling rule's C++ twin (kernels/twin.py), reached by pointer."""
    temperature, top_k, top_p, seed = rule
    return SamplingArgs(_twin_sample_rows(), None if ids is None else ids.data_ptr(), temperature, top_k, top_p,
                        seed, position)


def sampled_verify(hidden: torch.Tensor, head, drafts: torch.Tensor, first: int, rule: tuple,
                   start: int) -> tuple[torch.Tensor, int]:
    """hidden [R, H] final-norm rows of [bonus, d_1 .. d_K] of one sampled row (`rule`: temperature > 0,
    top_k, top_p, seed; the bonus at `start`), drafts [K] -> target tokens [R] (-1 after the first
    mismatch) and the accepted count: sampled `verify_lazily` for one sequence, the rule the twin's."""
    weight = head_weight(head)
    panels = head_panels(head, weight)
    hidden, drafts = hidden.contiguous(), drafts.to(torch.int64).contiguous()
    tokens = torch.full((hidden.shape[0],), -1, dtype=torch.int64)
    args = sampling_args(rule, start + 1)
    accepted = library().dfl_sampled_verify(hidden.data_ptr(), hidden.shape[0], hidden.shape[1], panels.data_ptr(),
                                            weight.shape[0], drafts.data_ptr(), first, ctypes.byref(args),
                                            tokens.data_ptr())
    if accepted < 0:
        raise ValueError(f"dfl_sampled_verify rejected its rule {rule} (temperature must be > 0)")
    return tokens, accepted


def sampled_trust(logits: torch.Tensor, columns: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor | None:
    """log softmax(logits / t)[column] per row (logits [N, V] fp32 CPU, columns [N], temperature [N] > 0;
    -inf for a row with a NaN): the trust the C++ draft step's cut adds up; None without the library."""
    if library() is None or logits.dtype != torch.float32 or logits.device.type != "cpu" or not eager():
        return None
    logits = logits.contiguous()
    columns, temperature = columns.to(torch.int64).contiguous(), temperature.to(torch.float32).contiguous()
    out = torch.empty(logits.shape[0], dtype=torch.float32)
    library().dfl_sampled_trust(logits.data_ptr(), logits.shape[0], logits.shape[1], columns.data_ptr(),
                                temperature.data_ptr(), out.data_ptr())
    return out


def greedy_drafts(hidden: torch.Tensor, head, min_confidence: float, first: int) -> torch.Tensor:
    """hidden [K, H] draft rows -> greedy drafts [K' <= K] (indices into the head's rows) with the
    confidence cut: `decoding.drafts.confident_drafts` for one sequence."""
    weight = head_weight(head)
    panels = head_panels(head, weight)
    hidden = hidden.contiguous()
    tokens = torch.empty(hidden.shape[0], dtype=torch.int64)
    floor = math.log(min_confidence) if min_confidence > 0.0 else -math.inf
    kept = library().dfl_greedy_drafts(hidden.data_ptr(), hidden.shape[0], hidden.shape[1], panels.data_ptr(),
                                       weight.shape[0], floor, first, tokens.data_ptr())
    return tokens[:kept]
