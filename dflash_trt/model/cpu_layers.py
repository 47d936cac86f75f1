"""CPU passes through one C++ call per decoder layer (cpu_kernels/decoder_layer.cpp).

An eager PyTorch layer at 1..16 rows is ~50 small ops, each a few to ~20 µs of dispatch, plus MKL's
small-matrix setup per projection; on a 2-core CPU that, not arithmetic, is most of a decode step.
The C++ layer does norm → q/k/v → q/k norm + RoPE → cache write → attention → o_proj → MLP in one
call that streams each weight once. Its rows are independent (the same instruction sequence per
row whatever the row count or batch), so a verify pass reproduces one-token decoding bit for bit.

Used by `Target.forward` (causal) and `DFlashDraft.forward` (non-causal blocks over [context ;
block], ragged contexts) when `eligible`: fp32 CPU tensors, each sequence's rows at consecutive
positions, at most MAX_ROWS rows in all, no autograd or graph recording, fused q/k/v and gate/up
weights, plain modules. Everything else (training, quantization simulation, sliding-window or
causal drafters, GPUs) keeps the torch path. The greedy heads (`greedy_verify`, `greedy_drafts`)
and `rms_norm` live in the same library. `DFLASH_TRT_CPU_LAYERS=0` turns it all off; without a
C++ compiler it is off with one warning. The library is built with g++ -O3 -march=native on first
use (a few seconds) and cached (kernels/host_build.py).
"""

from __future__ import annotations

import contextvars
import ctypes
import functools
import math
import os
import warnings
from pathlib import Path

import torch
from torch import nn

from dflash_trt.errors import MissingDependencyError
from dflash_trt.model.kv_cache import KVCache

ENV = "DFLASH_TRT_CPU_LAYERS"
MAX_ROWS = 256  # rows per pass (all sequences); measured faster than the torch path up to here on the
# 2-core CPU, prompts included (6-layer tiny target: 128 rows 14.2 vs 17.6 ms, 256 rows 28.4 vs 34.5 ms)

SOURCE_DIR = Path(__file__).resolve().parent / "cpu_kernels"
FLAGS = ("-std=c++17", "-shared", "-fPIC", "-O3", "-march=native", "-Wall", "-Wextra", "-Werror")
PORTABLE_FLAGS = tuple(f for f in FLAGS if f != "-march=native")  # no AVX2 / FMA: the plain C++ loops

_p, _i32 = ctypes.c_void_p, ctypes.c_int32


class _Weights(ctypes.Structure):
    """Mirror of DflLayerWeights in decoder_layer.cpp."""

    _fields_ = [("input_norm", _p), ("qkv", _p), ("q_norm", _p), ("k_norm", _p), ("o_proj", _p),
                ("post_norm", _p), ("gate_up", _p), ("down", _p), ("hidden", _i32), ("heads", _i32),
                ("kv_heads", _i32), ("head_dim", _i32), ("intermediate", _i32), ("eps", ctypes.c_float)]


class _DraftStep(ctypes.Structure):
    """Mirror of DflDraftStep in decoder_layer.cpp."""

    _fields_ = [("layers", ctypes.POINTER(ctypes.POINTER(_Weights))), ("n_layers", _i32), ("fc", _p), ("fc_in", _i32),
                ("hidden_norm", _p), ("hidden_eps", ctypes.c_float), ("final_norm", _p), ("final_eps", ctypes.c_float),
                ("head", _p), ("vocab", _i32), ("vocab_ids", _p), ("first", _i32)]


_i64 = ctypes.c_int64
_SIGNATURES = {  # name: (restype, argtypes)
    "dfl_decoder_layer": (_i32, [ctypes.POINTER(_Weights), _p, _i32, _i32, _p, _p, _p, _p, _p, _p, _p, _p, _i32, _i32]),
    "dfl_decoder_layer_rows": (_i32, [ctypes.POINTER(_Weights), _p, _i32, _i32, _p, _p, _p, _p, _p, _p, _p, _p, _i32,
                                      _i32, _i32, _i32, _i32]),
    "dfl_matmul_nt": (None, [_p, _i32, _i32, _p, _i32, _p]),
    "dfl_pack_panels": (None, [_p, _i32, _i32, _p]),
    "dfl_matmul_panels": (None, [_p, _i32, _i32, _p, _i32, _p]),
    "dfl_rms_norm": (None, [_p, _i32, _i32, _p, ctypes.c_float, _p]),
    "dfl_greedy_verify": (_i32, [_p, _i32, _i32, _p, _i32, _p, _i32, _p]),
    "dfl_greedy_drafts": (_i32, [_p, _i32, _i32, _p, _i32, ctypes.c_float, _i32, _p]),
    "dfl_draft_step": (_i32, [ctypes.POINTER(_DraftStep), _p, _i32, _p, _i32, _p, _p, _p, _p, _i64, _i64, _i64, _i32,
                              ctypes.c_float, _p, _p]),
}


def build_library(flags: tuple[str, ...] = FLAGS, cpu_specific: bool = True) -> ctypes.CDLL:
    """Compile (or reuse the cached build of) decoder_layer.cpp with `flags` and load it."""
    from dflash_trt.kernels.host_build import (  # not at import: kernels imports the model
        HostLibrary,
        build,
    )

    spec = HostLibrary("libdflash_cpu_layer.so", "decoder_layer.cpp", ("decoder_layer.cpp",), flags,
                       root=SOURCE_DIR, cpu_specific=cpu_specific)
    handle = ctypes.CDLL(str(build(spec)))
    for name, (restype, argtypes) in _SIGNATURES.items():
        fn = getattr(handle, name)
        fn.restype, fn.argtypes = restype, argtypes
    return handle


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled layer library, or None when turned off or not buildable (warns once)."""
    if os.environ.get(ENV, "1") == "0":
        return None
    try:
        return build_library()
    except (MissingDependencyError, RuntimeError, OSError) as e:
        warnings.warn(f"C++ CPU decoder layer unavailable, using the torch path: {e}", stacklevel=2)
        return None


def eager() -> bool:
    """Plain eager execution: no autograd, and nothing recording the graph (ONNX export, tracing,
    torch.compile) — a ctypes call is invisible to them and would be baked in as a constant."""
    return not (torch.is_grad_enabled() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export()
                or torch.compiler.is_compiling())


def eligible(positions: torch.Tensor, cache: KVCache) -> bool:
    """Rows [B, T] at consecutive positions each (start_b + 0..T-1), B * T <= MAX_ROWS, an fp32 CPU
    cache, `eager`."""
    b, t = positions.shape
    if not (b * t <= MAX_ROWS and cache.k.device.type == "cpu" and cache.k.dtype == torch.float32 and eager()):
        return False
    if b == 1:
        row = positions[0].tolist()  # one conversion (each tensor element read is ~5 µs in a decode loop)
        consecutive = row[-1] - row[0] == t - 1
    else:
        consecutive = t == 1 or bool((positions[:, 1:] - positions[:, :-1] == 1).all())
    return consecutive and library() is not None


def _version(t: torch.Tensor | None) -> int:
    """The in-place modification counter (an optimizer step or load_state_dict bumps it); inference
    tensors have none (0)."""
    return -1 if t is None else (0 if t.is_inference() else t._version)


def _versions(tensors) -> tuple[int, ...]:
    return tuple(_version(t) for t in tensors)


class LayerPlan:
    """The weight pointers of one decoder layer (and a packed copy of its projections); valid while
    `_objects(layer)` returns the same tensors, unmodified (`_versions`)."""

    def __init__(self, objects: tuple, layer: nn.Module):
        self.objects = objects  # keeps the tensors alive and identifies them
        self.versions = _versions(objects)
        qkv, gate_up, o_w, down_w, in_norm, post_norm, q_norm, k_norm = objects
        self.panels = [pack_panels(w) for w in (qkv, o_w, gate_up, down_w)]  # a copy of the projections
        qkv, o_w, gate_up, down_w = self.panels
        attn = layer.self_attn
        ptr = lambda t: None if t is None else t.data_ptr()
        self.weights = _Weights(ptr(in_norm), ptr(qkv), ptr(q_norm), ptr(k_norm), ptr(o_w), ptr(post_norm),
                                ptr(gate_up), ptr(down_w), objects[2].shape[0], attn.num_heads, attn.num_kv_heads,
                                attn.head_dim, objects[3].shape[1], layer.input_layernorm.eps)
        self.pointer = ctypes.pointer(self.weights)


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] -> [ceil(N / 8), K, 8], the layout the layer's projections stream (zero-padded)."""
    n, k = weight.shape
    panels = torch.empty((n + 7) // 8, k, 8, dtype=torch.float32)
    library().dfl_pack_panels(weight.detach().contiguous().data_ptr(), n, k, panels.data_ptr())
    return panels


def _weight(module: nn.Module) -> torch.Tensor | None:
    """The weight of a module without hooks (None: hooked, e.g. calibration, or weightless)."""
    if module._forward_hooks or module._forward_pre_hooks:
        return None
    return module._parameters.get("weight")


def _objects(layer: nn.Module) -> tuple:
    """The tensors the C++ layer reads (module dicts read directly: this runs every pass)."""
    mods = layer._modules
    attn, mlp = mods["self_attn"], mods["mlp"]
    am = attn._modules
    return (attn.qkv, mlp.gate_up, _weight(am["o_proj"]), _weight(mlp._modules["down_proj"]),
            _weight(mods["input_layernorm"]), _weight(mods["post_attention_layernorm"]),
            _weight(am["q_norm"]), _weight(am["k_norm"]))


def _supported(layer: nn.Module, objects: tuple) -> bool:
    """Whether the C++ layer computes exactly what `layer` does: fused fp32 CPU weights, plain
    bias-free projections, RMSNorms with one eps (q/k norms may be absent: Llama)."""
    from dflash_trt.model.layers import RMSNorm

    attn, mlp = layer.self_attn, layer.mlp
    linears = (attn.o_proj, mlp.down_proj)
    norms = [layer.input_layernorm, layer.post_attention_layernorm]
    norms += [n for n in (attn.q_norm, attn.k_norm) if type(n) is not nn.Identity]
    tensors = [t for t in objects if t is not None]
    return (all(t is not None for t in objects[:6]) and len(tensors) == 4 + len(norms)
            and all(type(m) is nn.Linear and m.bias is None for m in linears)
            and all(type(n) is RMSNorm for n in norms) and len({n.eps for n in norms}) == 1
            and all(t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous() for t in tensors))


_FIXED: contextvars.ContextVar[dict | None] = contextvars.ContextVar("dflash_trt_fixed_weights", default=None)


def fixed_weights(fn):
    """Decorator for a decode loop: its weights do not change while it runs, so `plans` checks each
    layer list on its first pass only (a 24-layer check is ~135 µs warm and ~0.3-0.6 ms between the
    passes of a DRAM-bound decode, whose weight stream evicts the Python objects it reads)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        token = _FIXED.set(_FIXED.get() if _FIXED.get() is not None else {})
        try:
            return fn(*args, **kwargs)
        finally:
            _FIXED.reset(token)

    return run


def plans(layers: nn.ModuleList) -> list[LayerPlan] | None:
    """One plan per layer (cached on the layer, checked by identity every pass, rebuilt when its
    tensors change), or None if any layer is not one the C++ layer implements. Inside a
    `fixed_weights` call the first pass's plans are reused without the checks."""
    fixed = _FIXED.get()
    if fixed is not None and (known := fixed.get(id(layers))) is not None and known[0] is layers:
        return known[1]
    out = []
    for layer in layers:
        objects = _objects(layer)
        plan = layer.__dict__.get("_cpu_plan")
        if plan is None or any(a is not b for a, b in zip(plan.objects, objects)) or plan.versions != _versions(objects):
            if not _supported(layer, objects):
                return None
            plan = LayerPlan(objects, layer)
            layer.__dict__["_cpu_plan"] = plan
        out.append(plan)
    if fixed is not None:
        fixed[id(layers)] = (layers, out)
    return out


def run_layers(
    plans: list[LayerPlan],
    x: torch.Tensor,  # [B * Q, H] fp32 contiguous, updated in place (Q block rows per sequence)
    context: torch.Tensor | None,  # [sum C_b, H] context features (K/V only), sequence by sequence, or None
    context_counts: torch.Tensor | None,  # [B] int32 C_b (None: no context)
    cache: KVCache,
    slots: torch.Tensor,  # [B] int64 cache slot of each sequence
    starts: torch.Tensor,  # [B] int64 absolute position of each sequence's first row of [context ; block]
    cos: torch.Tensor,  # [sum (C_b + Q), D] RoPE rows of those positions, sequence by sequence
    sin: torch.Tensor,
    causal: bool,
    after_layer=None,  # called with the layer index after each layer (taps)
) -> None:
    """All decoder layers over B sequences of [context ; block]; K/V of every row go to `cache`
    (layer i of `plans` uses cache layer i). Arguments are checked once, then one C++ call a layer."""
    call = _LayerCall(plans, x, context, context_counts, cache, slots, starts, cos, sin, causal)
    for i in range(len(plans)):
        call(i, 0, call.q_rows, write_kv=True)
        if after_layer is not None:
            after_layer(i)


def layer_rows(plans: list[LayerPlan], index: int, rows: tuple[int, int], x, context, context_counts, cache, slots,
               starts, cos, sin, causal: bool, write_kv: bool) -> None:
    """Layer `index` (`run_layers` arguments) for block rows rows[0]..rows[1]-1 of each sequence only;
    with `write_kv` it stores every row's K/V, else they must be in the cache already. Outputting a
    layer's rows in stages (the first with write_kv) gives every row the numbers of a whole pass: the
    drafter's last layer does this inside `DraftStep`. Needs the query heads to fill whole panels
    (heads x head_dim a multiple of 8; else ValueError)."""
    _LayerCall(plans, x, context, context_counts, cache, slots, starts, cos, sin, causal)(index, *rows, write_kv)


class _LayerCall:
    """The checked, pointer-level arguments of one pass; call(i, lo, hi, write_kv) runs layer i."""

    def __init__(self, plans, x, context, context_counts, cache, slots, starts, cos, sin, causal):
        n = slots.shape[0]
        self.q_rows = x.shape[0] // n
        ends = starts + self.q_rows + (0 if context_counts is None else context_counts)
        last = int(ends.max()) - 1
        if last >= cache.capacity:
            raise IndexError(f"KV cache capacity {cache.capacity} exceeded (position {last})")
        for t in (x, slots, starts, cos, sin, *(() if context is None else (context, context_counts))):
            assert t.is_contiguous() and t.device.type == "cpu"
        self.plans, self.n, self.starts = plans, n, starts
        self.layer_bytes = cache.k[0].numel() * cache.k.element_size()  # [slots, kv_heads, capacity, D] per layer
        self.k_base, self.v_base = cache.k.data_ptr(), cache.v.data_ptr()
        self.args = (x.data_ptr(), n, self.q_rows, None if context is None else context.data_ptr(),
                     None if context_counts is None else context_counts.data_ptr(), cos.data_ptr(), sin.data_ptr())
        self.tail = (slots.data_ptr(), starts.data_ptr(), cache.capacity, int(causal))

    def __call__(self, i: int, lo: int, hi: int, write_kv: bool) -> None:
        lib, offset = library(), i * self.layer_bytes
        head = (self.plans[i].pointer, *self.args, self.k_base + offset, self.v_base + offset, *self.tail)
        if lo == 0 and hi == self.q_rows and write_kv:
            status = lib.dfl_decoder_layer(*head)
        else:
            status = lib.dfl_decoder_layer_rows(*head, lo, hi, int(write_kv))
        if status != 0:
            raise ValueError(f"dfl_decoder_layer rejected its sizes ({self.n} x {self.q_rows} rows, rows {lo}..{hi}, "
                             f"starts {self.starts.tolist()})")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """weight * x / rms(x) over the last dim through the layer's norm (contiguous fp32 CPU x and
    weight, `eager`), or None when it does not apply (a torch rms_norm call is ~20-60 µs here)."""
    if not (x.dtype == weight.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()
            and weight.is_contiguous() and eager()) or library() is None:
        return None
    out = torch.empty_like(x)
    n = x.shape[-1]
    library().dfl_rms_norm(x.data_ptr(), x.numel() // n, n, weight.data_ptr(), eps, out.data_ptr())
    return out


def matmul_ready(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `matmul_nt` can take x [R, K] and weight [N, K]: contiguous fp32 CPU, `eager`."""
    return (x.is_contiguous() and weight.is_contiguous() and eager()
            and x.shape[-1] == weight.shape[-1] and library() is not None)


def matmul_nt(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [R, K] @ weight[N, K]ᵀ -> [R, N] through the layer's row-independent projection (fp32 CPU)."""
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
    weight = head.weight
    return weight if weight.dtype == torch.float32 and weight.device.type == "cpu" else None


def _head_panels(head, weight: torch.Tensor) -> torch.Tensor:
    """`weight` packed once as panels and cached on the head (re-packed when the weight is replaced
    or modified in place)."""
    cached = head.__dict__.get("_cpu_panels")
    if cached is None or cached[0] is not weight or cached[1] != _version(weight):
        cached = (weight, _version(weight), pack_panels(weight))
        head.__dict__["_cpu_panels"] = cached
    return cached[2]


def head_matmul(x: torch.Tensor, head) -> torch.Tensor | None:
    """x [R, K] (fp32 CPU, contiguous) @ the weight of `head` (`head_weight`)ᵀ through its cached panels
    -> [R, N]; None when the head is not one the C++ code reads. Callers have checked `eager`."""
    weight = head_weight(head)
    if weight is None or library() is None or x.dtype != torch.float32 or not x.is_contiguous():
        return None
    out = torch.empty(x.shape[0], weight.shape[0], dtype=torch.float32)
    library().dfl_matmul_panels(x.data_ptr(), x.shape[0], x.shape[1], _head_panels(head, weight).data_ptr(),
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
    panels = _head_panels(head, weight)
    hidden, drafts = hidden.contiguous(), drafts.to(torch.int64).contiguous()
    tokens = torch.full((hidden.shape[0],), -1, dtype=torch.int64)
    accepted = library().dfl_greedy_verify(hidden.data_ptr(), hidden.shape[0], hidden.shape[1], panels.data_ptr(),
                                           weight.shape[0], drafts.data_ptr(), first, tokens.data_ptr())
    return tokens, accepted


def greedy_drafts(hidden: torch.Tensor, head, min_confidence: float, first: int) -> torch.Tensor:
    """hidden [K, H] draft rows -> greedy drafts [K' <= K] (indices into the head's rows) with the
    confidence cut: `model.draft.confident_drafts` for one sequence."""
    weight = head_weight(head)
    panels = _head_panels(head, weight)
    hidden = hidden.contiguous()
    tokens = torch.empty(hidden.shape[0], dtype=torch.int64)
    floor = math.log(min_confidence) if min_confidence > 0.0 else -math.inf
    kept = library().dfl_greedy_drafts(hidden.data_ptr(), hidden.shape[0], hidden.shape[1], panels.data_ptr(),
                                       weight.shape[0], floor, first, tokens.data_ptr())
    return tokens[:kept]


# --- one sequence's draft step --------------------------------------------------------------------


class DraftStep:
    """A drafter's whole one-sequence draft step in one C++ call (dfl_draft_step): context features
    (fc through cached panels, norm), every layer over [context ; block] with the last one lazily
    output for the confidence cut, final norm and the greedy head. Numbers equal to the separate
    calls (`run_layers`, `layer_rows`, `rms_norm`, `greedy_drafts`); what it saves is the Python
    between them (~0.5 ms a step while the target's weight stream evicts the objects it touches).
    Build with `DraftStep.of`; valid while the tensors it points to are (it keeps them alive)."""

    def __init__(self, plans: list[LayerPlan], fc_panels, fc_in: int, hidden_norm, final_norm, head_panels,
                 vocab: int, vocab_ids: torch.Tensor | None, first: int):
        self.keep = (plans, fc_panels, hidden_norm.weight, final_norm.weight, head_panels, vocab_ids)
        self.layers = (ctypes.POINTER(_Weights) * len(plans))(*(p.pointer for p in plans))
        self.struct = _DraftStep(self.layers, len(plans), fc_panels.data_ptr(), fc_in, hidden_norm.weight.data_ptr(),
                                 hidden_norm.eps, final_norm.weight.data_ptr(), final_norm.eps, head_panels.data_ptr(),
                                 vocab, None if vocab_ids is None else vocab_ids.data_ptr(), first)
        self.pointer = ctypes.pointer(self.struct)
        self.last_rows = 0  # block rows the last layer output in the latest call (tests read it)

    @staticmethod
    def of(owner, plans: list[LayerPlan], fc: nn.Module, hidden_norm, final_norm, head, vocab_ids, first: int):
        """The step for these modules, cached on `owner` (one entry) and rebuilt when any of them (or
        their packed panels) changes; None where the C++ code does not apply (see `head_weight`)."""
        fc_weight, head_w = head_weight(fc), head_weight(head)
        norms = (hidden_norm.weight, final_norm.weight)
        if fc_weight is None or head_w is None or library() is None or not all(
                w.dtype == torch.float32 and w.device.type == "cpu" and w.is_contiguous() for w in norms):
            return None
        if vocab_ids is not None and not (vocab_ids.dtype == torch.int64 and vocab_ids.is_contiguous()
                                          and vocab_ids.numel() == head_w.shape[0]):
            return None
        fc_panels, head_panels = _head_panels(fc, fc_weight), _head_panels(head, head_w)
        key = (*map(id, plans), id(fc_panels), id(head_panels), *map(id, norms), hidden_norm.eps, final_norm.eps,
               id(vocab_ids), first)
        cached = owner.__dict__.get("_cpu_draft_step")
        if cached is None or cached[0] != key:
            step = DraftStep(plans, fc_panels, fc_weight.shape[1], hidden_norm, final_norm, head_panels,
                             head_w.shape[0], vocab_ids, first)
            cached = (key, step)
            owner.__dict__["_cpu_draft_step"] = cached
        return cached[1]

    def __call__(self, block: torch.Tensor, target_hidden: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                 cache: KVCache, slot: int, start: int, min_confidence: float) -> torch.Tensor:
        """block [W, H] input rows, target_hidden [n, fc_in] (None: no new context), cos / sin
        [n + W, D] of positions start - n ..; -> drafts [K' <= W - 1] (tokens)."""
        n = 0 if target_hidden is None else target_hidden.shape[0]
        width = block.shape[0]
        for t in (block, cos, sin, *(() if target_hidden is None else (target_hidden,))):
            assert t.is_contiguous() and t.dtype == torch.float32 and t.device.type == "cpu"
        drafts = torch.empty(width - 1, dtype=torch.int64)
        last_rows = ctypes.c_int32(0)
        floor = math.log(min_confidence) if min_confidence > 0.0 else -math.inf
        kept = library().dfl_draft_step(
            self.pointer, block.data_ptr(), width, None if target_hidden is None else target_hidden.data_ptr(), n,
            cos.data_ptr(), sin.data_ptr(), cache.k.data_ptr(), cache.v.data_ptr(), cache.k[0].numel(), slot, start,
            cache.capacity, floor, drafts.data_ptr(), ctypes.byref(last_rows))
        if kept < 1:
            raise ValueError(f"dfl_draft_step rejected its sizes (block {width} rows at {start}, {n} context rows, "
                             f"cache capacity {cache.capacity})")
        self.last_rows = last_rows.value
        return drafts[:kept]
