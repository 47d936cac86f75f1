#!/usr/bin/env python
"""How far each decode pass of the CPU backend runs from this machine's limits.

For the target's pass at 1 row (an autoregressive step) and at a block's rows (a verify pass), and the
drafter's pass, at each context length: the bytes a pass must read (weights as the C++ layer streams them,
the K/V it attends to, the head) and its flops, against the time it takes here; then the bandwidth and
arithmetic rate that implies, as a share of what this machine measures (a 512 MiB read, an fp32 matmul).

    python scripts/roofline.py [--contexts 512,2048,8192] [--threads 1,2] [--block 16] [--out out/roofline]

The cache holds random K/V of each length (a pass's cost does not depend on the values), so no prompt is
prefilled. Writes results.json and prints one table per thread count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from dflash_trt.backends.cpu import draft as cpu_draft
from dflash_trt.backends.cpu import layers as cpu_layers
from dflash_trt.backends.cpu import ops
from dflash_trt.backends.cpu import target as cpu_target
from dflash_trt.cli.types import BUILTIN_DRAFT, BUILTIN_TARGET
from dflash_trt.engine.config import resolve_model_path
from dflash_trt.model.loader import apply_draft_vocab, load_pair

MIB = 1 << 20


def median_seconds(fn, repeats: int) -> float:
    """Median wall time of `fn` over `repeats` calls after two warm-ups."""
    fn(), fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine(threads: int) -> dict:
    """Read bandwidth (sum over 512 MiB, torch) and fp32 matmul rate (MKL, 1024^3) at `threads`."""
    torch.set_num_threads(threads)
    big = torch.rand(512 * MIB // 4)
    read_s = min(median_seconds(big.sum, 1) for _ in range(3))
    a = torch.rand(1024, 1024)
    mm_s = median_seconds(lambda: a @ a, 5)
    return {"threads": threads, "read_gb_s": big.numel() * 4 / read_s / 1e9, "matmul_gflop_s": 2 * 1024**3 / mm_s / 1e9}


def layer_stream(plans) -> tuple[int, int]:
    """(parameters, bytes) of the decoder layers' projections as the C++ layer streams them (its panels)."""
    params = sum(p.numel() for plan in plans for p in plan.objects[:4] if p is not None)
    return params, sum(p.numel() * p.element_size() for plan in plans for p in plan.panels)


def random_cache(model, context: int, rows: int):
    """A one-slot cache of `context + rows` positions holding random K/V (a pass's cost ignores the values)."""
    cache = model.new_cache(1, context + rows)
    cache.k.normal_(), cache.v.normal_()
    return cache


def kv_bytes_per_key(cache) -> int:
    """Bytes of K and V one position holds in one layer."""
    _, _, kv_heads, _, head_dim = cache.k.shape
    return 2 * kv_heads * head_dim * cache.k.element_size()


def target_pass(target, context: int, rows: int, repeats: int) -> dict:
    """The target's C++ pass over `rows` rows after `context` positions, its final norm and the full head."""
    d = target.config.dims
    cache = random_cache(target, context, rows)
    tokens = torch.randint(0, target.config.vocab_size, (1, rows))
    positions = torch.arange(context, context + rows)[None]
    slots = torch.tensor([0])
    plans = cpu_layers.plans(target.model.layers)
    seconds = median_seconds(lambda: cpu_target.forward(target, tokens, positions, cache, slots), repeats)
    layer_params, layer_bytes = layer_stream(plans)
    head = target.lm_head.weight
    keys = context + rows
    kv_read = keys * d.num_layers * kv_bytes_per_key(cache)
    weights = layer_bytes + head.numel() * head.element_size()
    flops = 2 * rows * (layer_params + head.numel()) + 4 * rows * keys * d.num_heads * d.head_dim * d.num_layers
    return {"bytes": weights + kv_read, "kv_bytes": kv_read, "flops": flops, "seconds": seconds}


def draft_pass(draft, lm_head, context: int, rows: int, repeats: int) -> dict:
    """The drafter's C++ pass over a block of `rows` after `context` positions (no new context rows), its
    final norm and the head over slots 1.. (the draft vocabulary's rows when it has one)."""
    d = draft.config.dims
    cache = random_cache(draft, context, rows)
    noise = torch.randn(1, rows, d.hidden_size)
    positions = torch.arange(context, context + rows)[None]
    slots = torch.tensor([0])
    head = lm_head if draft.vocab is None else draft.vocab[1]

    def run():
        hidden = cpu_draft.forward(draft, noise, positions, cache, slots)
        ops.greedy_drafts(hidden[0, 1:].contiguous(), head, 0.0, 4)

    seconds = median_seconds(run, repeats)
    plans = cpu_layers.plans(draft.layers)
    windows = [layer.window for layer in draft.layers]
    keys = [min(context + rows, w + rows) if w else context + rows for w in windows]
    kv_read = sum(keys) * kv_bytes_per_key(cache)
    head_w = ops.head_weight(head)
    layer_params, layer_bytes = layer_stream(plans)
    weights = layer_bytes + head_w.numel() * head_w.element_size()
    flops = 2 * rows * layer_params + 2 * (rows - 1) * head_w.numel() + sum(
        4 * rows * k * d.num_heads * d.head_dim for k in keys)
    return {"bytes": weights + kv_read, "kv_bytes": kv_read, "flops": flops, "seconds": seconds}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=BUILTIN_TARGET)
    ap.add_argument("--draft", default=BUILTIN_DRAFT)
    ap.add_argument("--contexts", default="512,2048,8192")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--draft-vocab", default="auto", help="'auto' (the drafter's recommended size), 'off' or N")
    ap.add_argument("--out", type=Path, default=Path("out/roofline"))
    args = ap.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    # the C++ layer follows torch's thread count up to this cap (backends/cpu/ops.py follow_torch_threads)
    os.environ["DFLASH_TRT_CPU_THREADS"] = str(max(counts))
    pair = load_pair(resolve_model_path(args.target, Path.cwd()), resolve_model_path(args.draft, Path.cwd()),
                     "fp32", "cpu")
    if args.draft_vocab != "off":
        apply_draft_vocab(pair, args.draft_vocab)
    if ops.library() is None:
        raise SystemExit("the C++ CPU layer did not build here: nothing to measure")
    contexts = [int(c) for c in args.contexts.split(",")]
    rows = []
    with torch.inference_mode():
        for threads in counts:
            limits = machine(threads)  # torch at `threads`: the C++ layer follows on its next pass
            for context in contexts:
                passes = {"AR step (target, 1 row)": target_pass(pair.target, context, 1, args.repeats),
                          f"verify (target, {args.block} rows)": target_pass(pair.target, context, args.block,
                                                                              args.repeats),
                          f"draft ({args.block} rows)": draft_pass(pair.draft, pair.target.lm_head, context,
                                                                  args.block, args.repeats)}
                for name, p in passes.items():
                    gb_s, gflop_s = p["bytes"] / p["seconds"] / 1e9, p["flops"] / p["seconds"] / 1e9
                    rows.append({"threads": threads, "context": context, "pass": name, **p, "gb_s": gb_s,
                                 "gflop_s": gflop_s, "bandwidth_share": gb_s / limits["read_gb_s"],
                                 "compute_share": gflop_s / limits["matmul_gflop_s"], "machine": limits,
                                 "cpp_threads": ops.library().dfl_threads()})
            print(f"\n{threads} thread(s) (the C++ layer: {rows[-1]['cpp_threads']}): read "
                  f"{limits['read_gb_s']:.1f} GB/s, fp32 matmul {limits['matmul_gflop_s']:.1f} GFLOP/s")
            print("| context | pass | MB read (K/V) | MFLOP | ms | GB/s (share) | GFLOP/s (share) |")
            print("|---|---|---|---|---|---|---|")
            for r in rows:
                if r["threads"] == threads:
                    print(f"| {r['context']} | {r['pass']} | {r['bytes'] / 1e6:.1f} ({r['kv_bytes'] / 1e6:.1f}) | "
                          f"{r['flops'] / 1e6:.0f} | {r['seconds'] * 1e3:.2f} | {r['gb_s']:.1f} "
                          f"({r['bandwidth_share']:.0%}) | {r['gflop_s']:.1f} ({r['compute_share']:.0%}) |")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(f"\n{args.out / 'results.json'}")


if __name__ == "__main__":
    main()
