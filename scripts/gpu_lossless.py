#!/usr/bin/env python
"""DFlash through the serving scheduler vs autoregressive decoding of the same target, per dtype, batch size,
block width and temperature, on any device: the torch runner on a GPU (scripts/gpu_check.sh), a short
fp32 tier on CPU in CI (tests/test_gpu_scripts.py).

The shipped trained pair (block 16, as the Qwen3-8B preset's drafter) decodes the held-out prompts with
`n_slots` = each batch size (1 and the presets' max_batch_size 8 by default) and each verify width (16 = the
presets' block, narrower ones as a block_size_schedule would pick); AR is the same target runner with
blocks of one. Greedy and sampled (same seeds) requests. Every cell reports whether the token ids are
identical to AR's, the first divergence, τ and the time; the exit status is 1 when a dtype named in
--require differs (fp32 by default: in bf16 a different row count per forward may round differently, and
GPUs have no batch-invariant mode yet, so bf16 is reported, not required).

    python scripts/gpu_lossless.py --device cuda --out out/gpu_check/lossless.json

`--cuda-graphs compare` instead decodes each cell's DFlash requests with every pass eager and with the passes
replayed from CUDA graphs (backends/torch/graphs.py; each run after one warm-up run that captures them): whether
the tokens are identical (required for the --require dtypes) and tokens/s of each. `on` / `off` set the engine's
switch for the DFlash-vs-AR cells (default on, the runtime's default).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_trt.decoding.requests import Request, StopCriteria  # noqa: E402
from dflash_trt.decoding.sampling import SamplingParams  # noqa: E402
from dflash_trt.engine.golden import builtin_prompts  # noqa: E402
from dflash_trt.model.loader import load_pair  # noqa: E402
from dflash_trt.runtime.backends import pair_runners  # noqa: E402
from dflash_trt.runtime.generate import Engine  # noqa: E402
from dflash_trt.runtime.scheduler import ServiceLimits  # noqa: E402

ASSETS = ROOT / "dflash_trt" / "assets"


def first_divergence(got: list[list[int]], want: list[list[int]]) -> dict | None:
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            return {"request": i, "position": at, "got": a[at: at + 4], "ar": b[at: at + 4]}
    return None


def cell(pair, prompts, batch: int, width: int, temperature: float, max_new: int, graphs: bool = True) -> dict:
    d = pair.draft.config
    limits = ServiceLimits(batch, max(len(p) for p in prompts) + max_new, d.block_size,
                           block_size_schedule={1: width} if width < d.block_size else None, width_policy="schedule",
                           cuda_graphs=graphs)
    requests = [Request(tuple(p), SamplingParams(temperature, 0, 1.0, 1000 + i), StopCriteria(max_new))
                for i, p in enumerate(prompts)]
    start = time.perf_counter()
    spec = Engine(*pair_runners(pair, limits), limits).generate(requests)
    spec_s = time.perf_counter() - start
    ar_limits = replace(limits, block_size=1)
    ar = Engine(*pair_runners(pair, ar_limits), ar_limits).generate(requests)
    got, want = [list(r.tokens) for r in spec], [list(r.tokens) for r in ar]
    lengths = [n for r in spec for n in r.acceptance_lengths]
    return {"batch": batch, "width": width, "temperature": temperature, "requests": len(requests),
            "identical": got == want, "first_divergence": first_divergence(got, want),
            "tau": round(sum(lengths) / max(len(lengths), 1), 3), "seconds": round(spec_s, 2)}


def graphs_cell(pair, prompts, batch: int, temperature: float, max_new: int) -> dict:
    """One cell of DFlash decoding eager and from CUDA graphs: identical tokens and tokens/s of each."""
    limits = ServiceLimits(batch, max(len(p) for p in prompts) + max_new, pair.draft.config.block_size,
                           width_policy="schedule")
    requests = [Request(tuple(p), SamplingParams(temperature, 0, 1.0, 1000 + i), StopCriteria(max_new))
                for i, p in enumerate(prompts)]
    runs = {}
    for mode, graphs in (("eager", False), ("graphs", True)):
        engine = Engine(*pair_runners(pair, replace(limits, cuda_graphs=graphs)), replace(limits, cuda_graphs=graphs))
        engine.generate(requests)  # warm-up: allocations, and the graphs' capture
        if pair.target.lm_head.weight.is_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        results = engine.generate(requests)
        if pair.target.lm_head.weight.is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        graphs_run = engine.scheduler.target.graphs
        runs[mode] = {"tokens": [list(r.tokens) for r in results], "seconds": seconds,
                      "tokens_per_s": round(sum(len(r.tokens) for r in results) / seconds, 1),
                      "verify_replays": graphs_run.replays if graphs_run is not None else 0}
    eager, graphed = runs["eager"], runs["graphs"]
    return {"batch": batch, "temperature": temperature, "requests": len(requests),
            "identical": eager["tokens"] == graphed["tokens"],
            "first_divergence": first_divergence(graphed["tokens"], eager["tokens"]),
            "eager_tokens_per_s": eager["tokens_per_s"], "graphs_tokens_per_s": graphed["tokens_per_s"],
            "speedup": round(graphed["tokens_per_s"] / eager["tokens_per_s"], 3),
            "verify_replays": graphed["verify_replays"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when visible)")
    parser.add_argument("--dtypes", default="fp32,bf16")
    parser.add_argument("--batch-sizes", default="1,8")
    parser.add_argument("--widths", default="16,8,4")
    parser.add_argument("--temperatures", default="0,0.8")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--require", default="fp32", help="dtypes that must match AR exactly (comma list)")
    parser.add_argument("--cuda-graphs", choices=("on", "off", "compare"), default="on",
                        help="on / off: the engine's CUDA graphs in the DFlash-vs-AR cells; compare: eager vs graphs")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "gpu_check" / "lossless.json")
    args = parser.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    split = lambda text, kind: [kind(x) for x in text.split(",") if x]  # noqa: E731
    prompts = [r["token_ids"] for r in builtin_prompts(args.prompts)]
    report = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu", "torch": torch.__version__,
              "pair": "dflash_trt/assets/tiny-qwen3 + tiny-qwen3-dflash", "cells": []}
    failed = []
    for dtype in split(args.dtypes, str):
        pair = load_pair(ASSETS / "tiny-qwen3", ASSETS / "tiny-qwen3-dflash", dtype=dtype, device=device)
        for batch in split(args.batch_sizes, int):
            if args.cuda_graphs == "compare":
                for temperature in split(args.temperatures, float):
                    row = {"dtype": dtype, **graphs_cell(pair, prompts, batch, temperature, args.max_new_tokens)}
                    report["cells"].append(row)
                    print(json.dumps(row), flush=True)
                    if not row["identical"] and dtype in split(args.require, str):
                        failed.append(row)
                continue
            for width in split(args.widths, int):
                for temperature in split(args.temperatures, float):
                    row = {"dtype": dtype, **cell(pair, prompts, batch, width, temperature, args.max_new_tokens,
                                                          args.cuda_graphs == "on")}
                    report["cells"].append(row)
                    print(json.dumps(row), flush=True)
                    if not row["identical"] and dtype in split(args.require, str):
                        failed.append(row)
        del pair
    report["required_identical"] = split(args.require, str)
    report["failed"] = failed
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    against = "eager" if args.cuda_graphs == "compare" else "AR"
    print(f"wrote {args.out}: {len(report['cells'])} cells, {len(failed)} required cells differ from {against}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
