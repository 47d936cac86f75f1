#!/usr/bin/env python
"""Our runtime vs z-lab's reference `dflash_generate` (PyPI dflash==0.1.0) on the same pair and prompts.

Both decode each prompt greedily at batch 1 on this machine, alternating, in fp32; the script
checks the tokens are identical and prints the wall-time ratio (goal: >= 1.5x faster).

    python scripts/compare_reference.py [--target DIR --draft DIR] [--num-prompts 16] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def main() -> None:
    from dflash_trt.bench.local import load_prompts
    from dflash_trt.bench.reference import compare_with_reference
    from dflash_trt.decoding.width import AdaptiveWidth
    from dflash_trt.engine.config import resolve_model_path
    from dflash_trt.runtime.local import load_pair

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="builtin:tiny-qwen3")
    ap.add_argument("--draft", default="builtin:tiny-qwen3-dflash")
    ap.add_argument("--prompts", help="JSONL of prompts (default: the shipped held-out prompts)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--adaptive-cost", type=float, help="ours picks verify widths (decoding/width.py); tokens stay identical")
    ap.add_argument("--draft-confidence", type=float, default=0.0,
                    help="ours verifies only the drafts the drafter trusts this much (0 = full blocks)")
    args = ap.parse_args()
    target_dir, draft_dir = resolve_model_path(args.target, Path.cwd()), resolve_model_path(args.draft, Path.cwd())
    pair = load_pair(target_dir, draft_dir, "fp32", "cpu")  # also pins CPU threads (DFLASH_TRT_CPU_THREADS)
    prompts = load_prompts(args.prompts, pair.tokenizer, args.num_prompts)
    width = AdaptiveWidth(args.block_size, args.adaptive_cost) if args.adaptive_cost is not None else None
    c = compare_with_reference(pair, prompts, args.block_size, args.max_new_tokens, width,
                               min_confidence=args.draft_confidence)
    print(f"prompts {c.prompts}, block size {c.block_size}, {c.generated_tokens} tokens, "
          f"torch threads {torch.get_num_threads()}")
    print(f"identical tokens: {c.identical_prompts}/{c.prompts}")
    print(f"dflash-trt torch runtime: {c.ours_seconds:.2f} s ({c.generated_tokens / c.ours_seconds:.1f} tok/s)")
    print(f"z-lab dflash_generate:    {c.reference_seconds:.2f} s ({c.generated_tokens / c.reference_seconds:.1f} tok/s)")
    print(f"speed-up vs reference: {c.speedup:.2f}x")
    if c.identical_prompts != c.prompts:
        raise SystemExit("tokens differ from the reference")


if __name__ == "__main__":
    main()
