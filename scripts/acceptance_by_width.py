#!/usr/bin/env python3
"""Per-position acceptance of the shipped pair at forced verify widths: does a narrow draft block draft like
the first positions of a wide one? (The measured-width policy pools acceptance per position across widths,
decoding/width.py.)

    python scripts/acceptance_by_width.py --temperature 0,0.7,1.0 --widths 2,4,8,16

Batch 1, fp32, one thread, draft vocabulary `auto`, confidence cut 0.1 (bench's CPU defaults), held-out
prompts, seed = prompt index. Prints, per temperature and width, the committed tokens per step and
P(the first i drafts accepted) for i = 1..7 (a draft the cut dropped counts as not accepted).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_ar_floor import ForcedWidth  # noqa: E402  (this folder: every step at one width)

from dflash_trt.bench.local import load_prompts  # noqa: E402
from dflash_trt.decoding.decode import speculative_generate  # noqa: E402
from dflash_trt.decoding.requests import Request, StopCriteria  # noqa: E402
from dflash_trt.decoding.sampling import SamplingParams  # noqa: E402
from dflash_trt.engine.config import ASSETS  # noqa: E402
from dflash_trt.runtime.local import apply_draft_vocab, load_pair  # noqa: E402


class Forced(ForcedWidth):
    """Every step at one width; records each step's accepted drafts."""

    def __init__(self, block_size: int, forced: int):
        super().__init__(block_size, forced)
        self.log = []

    def update(self, bands, accepted, width, seconds, spent=None) -> None:
        if width == self.forced:  # the last blocks of a request narrow: not this width's evidence
            self.log.extend(accepted)
        super().update(bands, accepted, width, seconds, spent)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--temperature", default="0,0.7,1.0")
    ap.add_argument("--widths", default="2,4,8,16")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()

    torch.set_num_threads(1)
    pair = load_pair(ASSETS / "tiny-qwen3", ASSETS / "tiny-qwen3-dflash", "fp32", "cpu")
    apply_draft_vocab(pair, "auto")
    prompts = load_prompts(None, None, args.num_prompts)
    block = pair.draft.config.block_size
    for temperature in (float(t) for t in args.temperature.split(",")):
        for w in (int(x) for x in args.widths.split(",")):
            forced = Forced(block, w)
            for i, p in enumerate(prompts):
                request = Request(tuple(p), SamplingParams(temperature, seed=i), StopCriteria(args.max_new_tokens))
                speculative_generate(pair.target, pair.draft, [request], block, width=forced, min_confidence=0.1)
            acc, n = forced.log, max(len(forced.log), 1)
            shares = [sum(a >= i for a in acc) / n for i in range(1, min(w, 8))]
            print(f"T {temperature} width {w:2d}: steps {len(acc):4d}  tokens/step {1 + sum(acc) / n:.3f}  "
                  f"P(first i accepted) " + " ".join(f"{s:.3f}" for s in shares), flush=True)


if __name__ == "__main__":
    main()
