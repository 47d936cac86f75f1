"""Fake CUDA: tensors that say `cuda:0` and compute on the CPU, with CUDA's device rules and a host-sync count.

What a CPU can prove about the torch runtime on a GPU without one:
- every op sees the devices CUDA would: a CPU tensor beside a CUDA one is an error unless it is a 0-dim
  scalar or the index of an indexing op (ATen's device checks);
- nothing reads a device tensor's memory from the host (`.numpy()`, `data_ptr()` raise);
- every host sync is counted by call site: a scalar read (`.item()`, `int()`, `bool()`, `float()`), `.tolist()`,
  printing, `nonzero` and what is built on it (a boolean-mask index, `masked_select`, `repeat_interleave`
  without `output_size`, `unique`), `torch.equal`, and a copy between host and device without
  `non_blocking=True` (ATen's copy then waits for the stream). On a GPU each drains the launch queue, and none
  may happen inside a CUDA graph capture.

`fake_cuda()` is a context manager: inside it `torch.cuda.is_available()` is true, factory functions, `.to()`
and `.cuda()` naming a CUDA device give fake tensors, `SYNCS` counts, and CUDA graphs are `FakeGraph`s
(capture records the calls and refuses a sync, as CUDA does; replay re-runs them on the captured tensors).
Every torch call on a fake tensor runs on its CPU tensor (`elem`), so results equal plain CPU results bit for
bit (tests/test_fake_cuda.py checks that).
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from pathlib import Path
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

CUDA = torch.device("cuda", 0)
PACKAGE = str(Path(__file__).resolve().parents[1] / "dflash_trt")
T = torch.Tensor

# calls that take CPU index tensors beside a CUDA tensor (ATen moves the indices)
INDEXING = {T.__getitem__, T.__setitem__, T.index_put_, T.index_put, torch.index_put}
# calls that read a device value on the host before they return
SYNCING = {T.item: "scalar read", T.__int__: "scalar read", T.__float__: "scalar read", T.__bool__: "scalar read",
           T.__index__: "scalar read", T.tolist: "tolist", T.__repr__: "print", T.__format__: "print",
           T.nonzero: "nonzero", torch.nonzero: "nonzero", T.masked_select: "masked_select",
           torch.masked_select: "masked_select", torch.equal: "torch.equal", T.equal: "torch.equal",
           torch.unique: "unique", T.unique: "unique", torch.unique_consecutive: "unique",
           torch.argwhere: "nonzero", torch.where: None, T.any: None}
# attributes answered by the wrapper itself (it says cuda:0)
OWN = {T.device.__get__, T.is_cuda.__get__, T.is_cpu.__get__, T.get_device, torch._has_compatible_shallow_copy_type}


class DeviceError(RuntimeError):
    """An op CUDA would refuse: tensors on different devices, or host access to device memory."""


class SyncLog:
    """Host syncs by (kind, call site): the innermost frame inside dflash_trt, else the nearest caller's. Syncs
    inside `region()` (code that would run under CUDA graph capture) are also counted apart."""

    def __init__(self):
        self.sites: Counter = Counter()
        self.in_region: Counter = Counter()
        self.depth = 0

    @property
    def total(self) -> int:
        return sum(self.sites.values())

    def reset(self) -> None:
        self.sites.clear()
        self.in_region.clear()

    def record(self, kind: str) -> None:
        site = _call_site()
        if CAPTURING:
            raise DeviceError(f"{kind} at {site} during CUDA graph capture (the stream cannot sync while capturing)")
        self.sites[(kind, site)] += 1
        if self.depth:
            self.in_region[(kind, site)] += 1

    @contextlib.contextmanager
    def region(self):
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def table(self, counts: Counter | None = None) -> str:
        counts = self.sites if counts is None else counts
        return "\n".join(f"{n:5d}  {kind:15s} {site}" for (kind, site), n in counts.most_common())


SYNCS = SyncLog()
CAPTURING: list[list] = []  # the tape of the CUDA graph being captured (at most one)


def _call_site() -> str:
    frames = traceback.extract_stack()[:-3]
    for frame in reversed(frames):
        if frame.filename.startswith(PACKAGE):
            return f"dflash_trt/{Path(frame.filename).relative_to(PACKAGE).as_posix()}:{frame.lineno}"
    for frame in reversed(frames):
        if Path(frame.filename).name != "fake_cuda.py" and "/torch/" not in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno}"
    return "?"


def _is_cuda(device) -> bool:
    return isinstance(device, (str, torch.device, int)) and not isinstance(device, bool) and \
        torch.device(device).type == "cuda"


class FakeCuda(torch.Tensor):
    """A CPU tensor (`elem`) that reports device cuda:0; only reachable through the `fake_cuda()` mode."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        out = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(),
                                                  storage_offset=elem.storage_offset(), dtype=elem.dtype,
                                                  device=CUDA, requires_grad=elem.requires_grad)
        out.elem = elem
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise DeviceError(f"{func} reached a fake CUDA tensor outside fake_cuda()")


def _unwrap(x):
    return x.elem if isinstance(x, FakeCuda) else x


def _wrap(x):
    if isinstance(x, torch.Tensor) and not isinstance(x, FakeCuda):
        return FakeCuda(x)
    return x


def _tensors(args, kwargs) -> list[torch.Tensor]:
    return [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]


class _FakeCudaMode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = _tensors(args, kwargs)
        fakes = [t for t in tensors if isinstance(t, FakeCuda)]
        if func in OWN:
            return func(*args, **kwargs)
        if func is T.pin_memory and not fakes:  # page-locked host memory: the host tensor stands in for it
            return args[0]
        if func in (T.to, T.cuda, T.cpu):
            out = self._transfer(func, args, kwargs)
            if fakes:
                taped(lambda: self._transfer(func, args, kwargs), out)
            return out
        if fakes and func in (T.numpy, T.data_ptr, T.untyped_storage):
            raise DeviceError(f"{func.__name__}() of a cuda:0 tensor read on the host (copy it to the host first)")
        if fakes and func is T.copy_:
            dst, src = args[0], args[1]
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            if isinstance(dst, FakeCuda) != isinstance(src, FakeCuda) and src.dim() > 0 and not non_blocking:
                SYNCS.record("copy to host" if isinstance(src, FakeCuda) else "copy to device")
            _unwrap(dst).copy_(_unwrap(src))
            taped(lambda: _unwrap(dst).copy_(_unwrap(src)), dst)
            return dst
        device = kwargs.get("device")
        if not fakes and not _is_cuda(device):
            return func(*args, **kwargs)
        if fakes:
            self._check_devices(func, args, tensors)
            kind = SYNCING.get(func)
            if kind:
                SYNCS.record(kind)
            if func in (T.repeat_interleave, torch.repeat_interleave) and "output_size" not in kwargs and \
                    any(isinstance(a, FakeCuda) and a.dim() > 0 for a in args[1:2]):
                SYNCS.record("repeat_interleave")
            if func in (T.__getitem__, T.__setitem__) and _bool_index(args[1]):
                SYNCS.record("boolean mask")
            if func is torch.where and len(args) == 1:
                SYNCS.record("nonzero")
        if _is_cuda(device):
            kwargs = {**kwargs, "device": torch.device("cpu")}
            if func in (torch.tensor, torch.as_tensor) and not fakes:  # built on the host, then copied
                if torch.as_tensor(args[0]).dim() > 0:
                    SYNCS.record("copy to device")
        out = tree_map(_wrap, func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs)))
        taped(lambda: func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs)), out)
        return out

    @staticmethod
    def _check_devices(func, args, tensors) -> None:
        if func in INDEXING:
            if func is T.__setitem__ and isinstance(args[2], torch.Tensor) and not isinstance(args[2], FakeCuda) \
                    and args[2].dim() > 0:
                SYNCS.record("copy to device")
            return
        stray = [t for t in tensors if not isinstance(t, FakeCuda) and t.dim() > 0]
        if stray:
            name = getattr(func, "__name__", str(func))
            raise DeviceError(f"{name}: expected all tensors on the same device, got cuda:0 and a cpu tensor of "
                              f"shape {tuple(stray[0].shape)}")

    @staticmethod
    def _transfer(func, args, kwargs):
        src, dtype, non_blocking = args[0], None, kwargs.get("non_blocking", False)
        if func is T.cpu:
            target = torch.device("cpu")
        elif func is T.cuda:
            target = CUDA
        else:
            target, dtype, non_blocking, _ = torch._C._nn._parse_to(*tree_map(_unwrap, args[1:]), **kwargs)
            if any(isinstance(a, FakeCuda) for a in args[1:]) or isinstance(kwargs.get("other"), FakeCuda):
                target = CUDA
        inner = _unwrap(src)
        if dtype is not None:
            inner = inner.to(dtype)
        if target is None:
            return FakeCuda(inner) if isinstance(src, FakeCuda) else inner
        to_cuda = _is_cuda(target)
        if to_cuda != isinstance(src, FakeCuda) and src.dim() > 0 and not non_blocking:
            SYNCS.record("copy to device" if to_cuda else "copy to host")
        if not to_cuda:
            return inner.clone() if isinstance(src, FakeCuda) and inner is src.elem else inner
        if isinstance(src, FakeCuda):
            return src if inner is src.elem else FakeCuda(inner)
        return FakeCuda(inner.detach() if isinstance(inner, torch.nn.Parameter) else inner)


def taped(run, out) -> None:
    """During a capture: keep the call (to re-run) and its outputs (to refill on replay)."""
    if CAPTURING:
        CAPTURING[-1].append((run, out))


class FakeGraph:
    """torch.cuda.CUDAGraph on fake CUDA: capture records every torch call on device tensors with the tensors it
    read and wrote; replay re-runs those calls on the same tensors and writes each result into the memory the
    captured call wrote. What a real graph bakes in stays baked: Python values computed during capture are not
    recomputed, and host code between the calls does not run again."""

    def __init__(self):
        self.tape: list = []
        self.replays = 0

    def replay(self) -> None:
        for run, out in self.tape:
            new = run()
            for old, value in zip(tree_flatten(out)[0], tree_flatten(new)[0]):
                if isinstance(old, FakeCuda) and isinstance(value, torch.Tensor):
                    value = _unwrap(value)
                    if value is not old.elem:
                        old.elem.copy_(value)
        self.replays += 1


@contextlib.contextmanager
def _graph(graph: FakeGraph, pool=None, **kwargs):
    if CAPTURING:
        raise DeviceError("a CUDA graph capture inside another")
    CAPTURING.append(graph.tape)
    try:
        yield graph
    finally:
        CAPTURING.pop()


class _Stream:
    def wait_stream(self, other) -> None:
        pass


def _bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, FakeCuda) and i.dtype == torch.bool for i in items)


@contextlib.contextmanager
def fake_cuda():
    """Inside: CUDA is available and means fake tensors; SYNCS starts at zero."""
    SYNCS.reset()
    patches = [
        mock.patch("torch.cuda.is_available", lambda: True),
        mock.patch("torch.cuda.device_count", lambda: 1),
        mock.patch("torch.cuda.synchronize", lambda *a, **k: SYNCS.record("synchronize")),
        mock.patch("torch.cuda.get_device_name", lambda *a, **k: "fake CUDA (CPU)"),
        mock.patch("torch.cuda.get_device_capability", lambda *a, **k: (9, 0)),
        mock.patch("torch.cuda.CUDAGraph", FakeGraph),
        mock.patch("torch.cuda.graph", _graph),
        mock.patch("torch.cuda.graph_pool_handle", lambda: None),
        mock.patch("torch.cuda.Stream", _Stream),
        mock.patch("torch.cuda.stream", lambda stream: contextlib.nullcontext()),
        mock.patch("torch.cuda.current_stream", lambda *a: _Stream()),
    ]
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        stack.enter_context(_FakeCudaMode())
        yield SYNCS


def to_fake(obj):
    """A module (or pair of modules) moved to fake CUDA in place: parameters, buffers and every tensor a module keeps
    as a plain attribute (fused weights, rope tables, a draft vocabulary). Parameters become plain fake tensors
    (inference only)."""
    if isinstance(obj, (tuple, list)):
        return type(obj)(to_fake(o) for o in obj)
    for module in obj.modules():
        for store in (module._parameters, module._buffers):
            for name, value in store.items():
                if value is not None and not isinstance(value, FakeCuda):
                    store[name] = FakeCuda(value.detach())
        for name, value in list(vars(module).items()):
            if name.startswith("_") and name not in ("_tables",):
                continue
            moved = tree_map(lambda x: FakeCuda(x.detach()) if isinstance(x, torch.Tensor)
                             and not isinstance(x, FakeCuda) else x, value)
            if moved is not value:
                setattr(module, name, moved) if not name.startswith("_") else vars(module).__setitem__(name, moved)
    return obj
