#!/usr/bin/env python3
"""Where DFlash's time goes at temperatures where drafting does not pay: AR against the DFlash loop with
every step forced to width 1 (plain AR steps that keep the draft context: the floor of "never slower")
and the `auto` policy, side by side in one run.

    python scripts/bench_ar_floor.py --temperature 0.7,1.0,1.5 --num-prompts 16 --repeats 2 [--forced 1,2,4]

The shipped pair, batch 1, fp32, one thread, draft vocabulary `auto`, confidence cut 0.1 (bench's CPU
defaults). Each prompt runs all decoders in a rotating order (this VM's speed drifts by several percent
over seconds: a fixed order biases whichever runs first); tokens must be identical. Forced width 1 never
runs the drafter, not even over the prompt, so it is a floor `auto` can only approach.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dflash_trt.bench.local import load_prompts  # noqa: E402
from dflash_trt.decoding.autoregressive import autoregressive_generate  # noqa: E402
from dflash_trt.decoding.decode import speculative_generate  # noqa: E402
from dflash_trt.decoding.requests import Request, StopCriteria  # noqa: E402
from dflash_trt.decoding.sampling import SamplingParams  # noqa: E402
from dflash_trt.decoding.width import MeasuredWidth  # noqa: E402
from dflash_trt.engine.config import ASSETS  # noqa: E402
from dflash_trt.runtime.local import apply_draft_vocab, load_pair  # noqa: E402


class ForcedWidth(MeasuredWidth):
    """Every step at one width (the measured policy's bookkeeping kept, its choice replaced)."""

    def __init__(self, block_size: int, forced: int):
        super().__init__(block_size)
        self.forced = forced

    def width(self, bands: list[int]) -> int:
        return self.forced


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--temperature", default="0.7,1.0,1.5")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--forced", default="1", help="forced widths to run beside AR and auto (comma list)")
    ap.add_argument("--draft", type=Path, default=ASSETS / "tiny-qwen3-dflash", help="drafter folder")
    args = ap.parse_args()

    torch.set_num_threads(1)
    pair = load_pair(ASSETS / "tiny-qwen3", args.draft, "fp32", "cpu")
    apply_draft_vocab(pair, "auto")
    prompts = load_prompts(None, None, args.num_prompts)
    k = args.block_size
    for temperature in (float(x) for x in args.temperature.split(",")):
        requests = [Request(tuple(p), SamplingParams(temperature, seed=i), StopCriteria(args.max_new_tokens))
                    for i, p in enumerate(prompts)]
        auto = MeasuredWidth(k, greedy=lambda batch: k)
        decoders = {"AR": lambda r: autoregressive_generate(pair.target, [r])}
        for w in (int(x) for x in args.forced.split(",") if x):
            decoders[f"width {w}"] = lambda r, w=w: speculative_generate(
                pair.target, pair.draft, [r], k, width=ForcedWidth(k, w), min_confidence=0.1)
        decoders["auto"] = lambda r: speculative_generate(pair.target, pair.draft, [r], k, width=auto,
                                                          min_confidence=0.1)
        for decode in decoders.values():  # warm-up
            decode(requests[0])
        seconds, tokens, identical = dict.fromkeys(decoders, 0.0), 0, True
        names = list(decoders)
        for repeat in range(args.repeats):
            for i, request in enumerate(requests):
                out = {}
                shift = (i + repeat) % len(names)
                for name in names[shift:] + names[:shift]:
                    t0 = time.perf_counter()
                    out[name] = decoders[name](request)[0].tokens
                    seconds[name] += time.perf_counter() - t0
                tokens += len(out["AR"])
                identical &= len({tuple(v) for v in out.values()}) == 1
        print(f"T {temperature}: " + "  ".join(f"{name} {tokens / s:.1f} tok/s ({seconds['AR'] / s:.3f}x AR)"
                                               for name, s in seconds.items()) + f"  identical: {identical}",
              flush=True)


if __name__ == "__main__":
    main()
