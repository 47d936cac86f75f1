"""CUDA graphs of the decode step's two passes: the draft pass (with its proposals) and the verify pass.

A small model's step on a GPU is bound by kernel launches, not by the GPU (each pass launches a few hundred
kernels); a graph replays them in one launch. A graph fixes every shape and every host value it saw at capture,
so each pass is captured per key: the number of rows (and the first slot when the slots are consecutive), the
block width, the keys the pass reads (rounded up to `KEYS_BUCKET` positions; attention masks the rest) and what
else shapes it (sampled rows, the pending context's length). What changes from step to step lives in tensors: the captured pass reads its inputs from static tensors
that each replay fills by device-to-device copies, and writes its outputs to static tensors the caller copies out
(as vLLM's and SGLang's runners do). A key is captured the second time it is seen (the first run is eager, and
warms up allocations); at most `MAX_GRAPHS` stay, least recently used first out.

The passes must not read the device back (a sync is an error during capture): the runners pass `Rows`, the
host's facts, so none does (tests/test_fake_cuda.py counts). Passes a graph cannot hold run eager: bad words,
the confidence cut, DFlash2's candidate walk, and a context that is not one verify step's.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable

import torch

KEYS_BUCKET = 256  # positions; a pass reads keys up to the next multiple (fewer graphs, a little masked work)
MAX_GRAPHS = 64  # captured passes kept per runner (each holds its static tensors; memory comes from one pool)


def keys_bucket(end: int, capacity: int) -> int:
    """The keys a captured pass reads for rows that need `end`: the next multiple of KEYS_BUCKET, within the cache."""
    return min(-(-end // KEYS_BUCKET) * KEYS_BUCKET, capacity)


def graph_slots(rows) -> tuple[int, int | None]:
    """What a captured pass fixes of its rows' slots: their number, and the first when they are one ascending run
    (its cache reads are views from there); other sets read through the slots tensor, an input like the rest."""
    return len(rows.slots), rows.first_slot


def capture(fn: Callable, inputs: tuple[torch.Tensor, ...], pool) -> tuple[Callable[[], None], tuple]:
    """Capture `fn(*inputs)` on the current CUDA device -> (replay, outputs): a warm-up run on a side stream, then
    the capture, as torch.cuda.graphs documents."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn(*inputs)
    return graph.replay, outputs


class PassGraphs:
    """Captured passes of one runner, by key. `run(key, fn, inputs)` returns what `fn(*inputs)` returns (a tuple of
    tensors): eager on a key's first sight, then from its graph, the outputs copied out of the static ones."""

    def __init__(self, capture_fn: Callable = capture, max_graphs: int = MAX_GRAPHS):
        self.capture_fn = capture_fn
        self.max_graphs = max_graphs
        self.graphs: OrderedDict = OrderedDict()  # key -> (replay, static inputs, static outputs)
        self.seen: Counter = Counter()
        self.pool = None
        self.replays = 0

    def run(self, key, fn: Callable, inputs: tuple[torch.Tensor, ...]) -> tuple:
        entry = self.graphs.get(key)
        if entry is None:
            self.seen[key] += 1
            if self.seen[key] < 2:
                return fn(*inputs)
            entry = self._capture(key, fn, inputs)
        self.graphs.move_to_end(key)
        replay, static_in, static_out = entry
        for static, value in zip(static_in, inputs):
            static.copy_(value)
        replay()
        self.replays += 1
        return tuple(None if t is None else t.clone() for t in static_out)

    def _capture(self, key, fn: Callable, inputs: tuple[torch.Tensor, ...]):
        if self.pool is None and torch.cuda.is_available():
            self.pool = torch.cuda.graph_pool_handle()
        static_in = tuple(t.clone() for t in inputs)
        replay, static_out = self.capture_fn(fn, static_in, self.pool)
        self.graphs[key] = (replay, static_in, tuple(static_out))
        if len(self.graphs) > self.max_graphs:
            self.graphs.popitem(last=False)
        return self.graphs[key]
