#!/usr/bin/env python3
"""Verify-width policies of the serving scheduler side by side, in process (no Triton): autoregressive
against DFlash under `auto`, `measured`, a fixed `block_size_schedule` and forced widths, one
`DFlashService` per arm over the same loaded pair, the arms in a rotating order each round.

    python scripts/bench_service_arms.py --concurrency 1,4,8 --temperature 0,0.7,1.0 --rounds 4

The shipped pair, tiny-cpu's runtime (fp32, one thread, draft vocabulary 1213, confidence cut 0.1), 32
held-out prompts x 64 tokens, all submitted at once to a scheduler of `concurrency` slots (continuous
batching). Prints each arm's throughput relative to AR; tokens must be identical across arms. Served
numbers (Triton, gRPC streams) come from `scripts/bench_served.sh`; this isolates the scheduler.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_trt.bench.local import load_prompts  # noqa: E402
from dflash_trt.decoding.requests import Request, StopCriteria  # noqa: E402
from dflash_trt.decoding.sampling import SamplingParams  # noqa: E402
from dflash_trt.engine.config import ASSETS  # noqa: E402
from dflash_trt.runtime.local import apply_draft_vocab, load_pair  # noqa: E402
from dflash_trt.runtime.service import DFlashService, ServiceLimits  # noqa: E402


def arms(block: int, schedule: dict[int, int], forced: list[int]) -> dict[str, dict]:
    out = {"AR": dict(block_size=1),
           "auto": dict(block_size=block, width_policy="auto"),
           "measured": dict(block_size=block, width_policy="measured"),
           f"schedule {schedule}": dict(block_size=block, block_size_schedule=schedule, width_policy="schedule")}
    for w in forced:
        out[f"width {w}"] = dict(block_size=block, block_size_schedule={1: w}, width_policy="schedule")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", default="1,4,8")
    ap.add_argument("--temperature", default="0,1.0")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--schedule", default='{"4": 8, "8": 4}', help="the fixed schedule arm (JSON)")
    ap.add_argument("--forced", default="1,4", help="forced verify widths, comma-separated ('' for none)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    pair = load_pair(ASSETS / "tiny-qwen3", ASSETS / "tiny-qwen3-dflash", "fp32", "cpu")
    apply_draft_vocab(pair, 1213)
    prompts = load_prompts(None, None, args.num_prompts)
    schedule = {int(k): int(v) for k, v in json.loads(args.schedule).items()}
    table = arms(pair.draft.config.block_size, schedule, [int(w) for w in args.forced.split(",") if w])
    for temperature in (float(t) for t in args.temperature.split(",")):
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            services = {name: DFlashService(pair, ServiceLimits(max_batch_size=concurrency, max_seq_len=512,
                                                                draft_confidence=0.1, **kw))
                        for name, kw in table.items()}
            seconds, identical, names = dict.fromkeys(table, 0.0), True, list(table)
            try:
                warm = [Request(tuple(p), SamplingParams(temperature, seed=i), StopCriteria(16))
                        for i, p in enumerate(prompts[:concurrency])]
                for service in services.values():
                    service.generate(warm)
                for r in range(args.rounds):
                    requests = [Request(tuple(p), SamplingParams(temperature, seed=i + 1000 * r),
                                        StopCriteria(args.max_new_tokens)) for i, p in enumerate(prompts)]
                    outputs = {}
                    shift = r % len(names)
                    for name in names[shift:] + names[:shift]:
                        t0 = time.perf_counter()
                        outputs[name] = [g.tokens for g in services[name].generate(requests)]
                        seconds[name] += time.perf_counter() - t0
                    identical &= len({json.dumps(v) for v in outputs.values()}) == 1
            finally:
                for service in services.values():
                    service.shutdown()
            print(f"T {temperature} c {concurrency}: "
                  + "  ".join(f"{name} {seconds['AR'] / s:.3f}x" for name, s in seconds.items())
                  + f"  identical: {identical}", flush=True)


if __name__ == "__main__":
    main()
