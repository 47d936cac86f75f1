"""CPU passes through one C++ call per decoder layer (cpu_kernels/decoder_layer.cpp).

An eager PyTorch layer at 1..16 rows is dozens of small ops, each paying its dispatch, plus MKL's
small-matrix setup per projection; at decode sizes that overhead, not the arithmetic, bounds a step.
The C++ layer does norm → q/k/v → q/k norm + RoPE → cache write → attention → o_proj → MLP in one
call that streams each weight once. Its rows are independent (the same instruction sequence per
row whatever the row count or batch), so a verify pass reproduces one-token decoding bit for bit.

Used by the CPU backend's target passes (target.py: causal) and draft passes (draft.py: non-causal
blocks over [context ; block], ragged contexts) when `eligible`: fp32 CPU tensors, each sequence's rows at consecutive
positions, at most MAX_ROWS rows in all, no autograd or graph recording, fused q/k/v and gate/up
weights, plain modules. Everything else (training, quantization simulation, sliding-window or
causal drafters, GPUs) keeps the torch path. The library itself (building, loading) and its
row-independent ops (RMSNorm, projections, greedy heads) are in ops.py.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import math

import torch
from torch import nn

from dflash_trt.backends.cpu import ops
from dflash_trt.backends.cpu.ops import (
    DraftStepArgs,
    LayerWeights,
    bf16_exact,
    bf16_panels,
    fp16_exact,
    fp16_panels,
    pack_panels,
    tensor_versions,
)
from dflash_trt.model.kv_cache import KVCache
from dflash_trt.model.layers import RMSNorm

HALF_PANELS = True  # weights that are all bf16 / fp16 values stream as 16-bit panels (tests compare with False)
MAX_ROWS = 256  # rows per C++ call (all sequences); larger passes run in pieces (target.py): past a few hundred
# rows MKL's blocked matmuls would win, and the pieces keep each row's bits those of a decode row


def eligible(positions: torch.Tensor, cache: KVCache) -> bool:
    """Rows [B, T] at consecutive positions each (start_b + 0..T-1), B * T <= MAX_ROWS, an fp32 CPU
    cache, `eager`."""
    b, t = positions.shape
    if not (b * t <= MAX_ROWS and cache.k.device.type == "cpu" and cache.k.dtype == torch.float32
            and ops.eager()):
        return False
    if b == 1:
        row = positions[0].tolist()  # one conversion: element reads each cost a torch call
        consecutive = row[-1] - row[0] == t - 1
    else:
        consecutive = t == 1 or bool((positions[:, 1:] - positions[:, :-1] == 1).all())
    return consecutive and ops.library() is not None


class LayerPlan:
    """The weight pointers of one decoder layer (and a packed copy of its projections); valid while
    `_objects(layer)` returns the same tensors, unmodified (`tensor_versions`)."""

    def __init__(self, objects: tuple, layer: nn.Module):
        self.objects = objects  # keeps the tensors alive and identifies them
        self.versions = tensor_versions(objects)
        qkv, gate_up, o_w, down_w, in_norm, post_norm, q_norm, k_norm = objects
        projections = (qkv, o_w, gate_up, down_w)
        self.panels = [pack_panels(w) for w in projections]  # a copy of the projections
        # weights that are all bf16 (or fp16) values, e.g. a bf16 / fp16 checkpoint held in fp32, stream as
        # their 16-bit form, widened exactly in the kernel: the same bits from half the bytes
        self.weight_format = 0
        if HALF_PANELS and all(bf16_exact(w) for w in projections):
            self.weight_format, self.panels = 1, [bf16_panels(p) for p in self.panels]
        elif HALF_PANELS and all(fp16_exact(w) for w in projections):
            self.weight_format, self.panels = 2, [fp16_panels(p) for p in self.panels]
        qkv, o_w, gate_up, down_w = self.panels
        attn = layer.self_attn
        ptr = lambda t: None if t is None else t.data_ptr()
        self.weights = LayerWeights(ptr(in_norm), ptr(qkv), ptr(q_norm), ptr(k_norm), ptr(o_w), ptr(post_norm),
                                ptr(gate_up), ptr(down_w), objects[2].shape[0], attn.num_heads, attn.num_kv_heads,
                                attn.head_dim, objects[3].shape[1], layer.input_layernorm.eps, self.weight_format,
                                    getattr(layer, "window", None) or 0)
        self.pointer = ctypes.pointer(self.weights)


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
    layer list on its first pass only (the check reads every layer's Python objects, which a decode's weight
    stream has evicted from the caches by the next pass)."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        with weights_fixed_in(_FIXED.get() if _FIXED.get() is not None else {}):
            return fn(*args, **kwargs)

    return run


@contextlib.contextmanager
def weights_fixed_in(memo: dict):
    """`fixed_weights` for a loop of calls that share `memo` (a dict the caller keeps, e.g. a server's
    scheduler across its steps): inside, `plans` checks each layer list once per memo."""
    token = _FIXED.set(memo)
    try:
        yield
    finally:
        _FIXED.reset(token)


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
        stale = plan is None or any(a is not b for a, b in zip(plan.objects, objects))
        if stale or plan.versions != tensor_versions(objects):
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
    copies: dict[int, int] | None = None,  # layer index -> address x's bytes are copied to after that layer (taps)
) -> None:
    """All decoder layers over B sequences of [context ; block]; K/V of every row go to `cache`
    (layer i of `plans` uses cache layer i). Arguments are checked once, then one C++ call a layer.
    `copies` addresses must each have room for x (a memmove, not a torch op)."""
    call = _LayerCall(plans, x, context, context_counts, cache, slots, starts, cos, sin, causal)
    copies, source, size = copies or {}, x.data_ptr(), x.numel() * x.element_size()
    for i in range(len(plans)):
        call(i, 0, call.q_rows, write_kv=True)
        if i in copies:
            ctypes.memmove(copies[i], source, size)


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
        self.tail = (slots.data_ptr(), starts.data_ptr(), cache.k.shape[3], int(causal))  # the position stride
        ops.follow_torch_threads(ops.library())

    def __call__(self, i: int, lo: int, hi: int, write_kv: bool) -> None:
        lib, offset = ops.library(), i * self.layer_bytes
        head = (self.plans[i].pointer, *self.args, self.k_base + offset, self.v_base + offset, *self.tail)
        if lo == 0 and hi == self.q_rows and write_kv:
            status = lib.dfl_decoder_layer(*head)
        else:
            status = lib.dfl_decoder_layer_rows(*head, lo, hi, int(write_kv))
        if status != 0:
            raise ValueError(f"dfl_decoder_layer rejected its sizes ({self.n} x {self.q_rows} rows, rows {lo}..{hi}, "
                             f"starts {self.starts.tolist()})")


# --- one sequence's draft step --------------------------------------------------------------------


class DraftStep:
    """A drafter's whole one-sequence draft step in one C++ call (dfl_draft_step): context features
    (fc through cached panels, norm), every layer over [context ; block] with the last one lazily
    output for the confidence cut, final norm and the greedy head. Numbers equal to the separate
    calls (`run_layers`, `layer_rows`, `rms_norm`, `greedy_drafts`); what it saves is the Python
    between them, which the target's weight stream makes slow (it evicts the objects that Python touches).
    Build with `DraftStep.of`; valid while the tensors it points to are (it keeps them alive)."""

    def __init__(self, plans: list[LayerPlan], fc_panels, fc_in: int, hidden_norm, final_norm, head_panels,
                 vocab: int, vocab_ids: torch.Tensor | None, first: int):
        self.keep = (plans, fc_panels, hidden_norm.weight, final_norm.weight, head_panels, vocab_ids)
        self.layers = (ctypes.POINTER(LayerWeights) * len(plans))(*(p.pointer for p in plans))
        self.struct = DraftStepArgs(self.layers, len(plans), fc_panels.data_ptr(), fc_in, hidden_norm.weight.data_ptr(),
                                 hidden_norm.eps, final_norm.weight.data_ptr(), final_norm.eps, head_panels.data_ptr(),
                                 vocab, None if vocab_ids is None else vocab_ids.data_ptr(), first)
        self.pointer = ctypes.pointer(self.struct)
        self.last_rows = 0  # block rows the last layer output in the latest call (tests read it)

    @staticmethod
    def of(owner, plans: list[LayerPlan], fc: nn.Module, hidden_norm, final_norm, head, vocab_ids, first: int):
        """The step for these modules, cached on `owner` (one entry) and rebuilt when any of them (or
        their packed panels) changes; None where the C++ code does not apply (see `head_weight`)."""
        fc_weight, head_w = ops.head_weight(fc), ops.head_weight(head)
        norms = (hidden_norm.weight, final_norm.weight)
        if fc_weight is None or head_w is None or ops.library() is None or not all(
                w.dtype == torch.float32 and w.device.type == "cpu" and w.is_contiguous() for w in norms):
            return None
        if vocab_ids is not None and not (vocab_ids.dtype == torch.int64 and vocab_ids.is_contiguous()
                                          and vocab_ids.numel() == head_w.shape[0]):
            return None
        fc_panels, head_panels = ops.head_panels(fc, fc_weight), ops.head_panels(head, head_w)
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
                 cache: KVCache, slot: int, start: int, min_confidence: float, sampling=None) -> torch.Tensor:
        """block [W, H] input rows, target_hidden [n, fc_in] (None: no new context), cos / sin
        [n + W, D] of positions start - n ..; -> drafts [K' <= W - 1] (tokens). `sampling`: None (greedy
        drafts) or the sequence's (temperature > 0, top_k, top_p, seed) for coupled drafts, picked by the
        sampling rule's C++ twin (`coupled_drafts`); the head's rows must then be in ascending token id."""
        n = 0 if target_hidden is None else target_hidden.shape[0]
        width = block.shape[0]
        for t in (block, cos, sin, *(() if target_hidden is None else (target_hidden,))):
            assert t.is_contiguous() and t.dtype == torch.float32 and t.device.type == "cpu"
        drafts = torch.empty(width - 1, dtype=torch.int64)
        last_rows = ctypes.c_int32(0)
        floor = math.log(min_confidence) if min_confidence > 0.0 else -math.inf
        rule = None if sampling is None else ctypes.byref(ops.sampling_args(sampling, start + 1, self.keep[-1]))
        lib = ops.library()
        ops.follow_torch_threads(lib)
        kept = lib.dfl_draft_step(
            self.pointer, block.data_ptr(), width, None if target_hidden is None else target_hidden.data_ptr(), n,
            cos.data_ptr(), sin.data_ptr(), cache.k.data_ptr(), cache.v.data_ptr(), cache.k[0].numel(), slot, start,
            cache.k.shape[3], floor, rule, drafts.data_ptr(), ctypes.byref(last_rows))
        if kept < 1:
            raise ValueError(f"dfl_draft_step rejected its sizes (block {width} rows at {start}, {n} context rows, "
                             f"cache capacity {cache.capacity})")
        self.last_rows = last_rows.value
        return drafts[:kept]
