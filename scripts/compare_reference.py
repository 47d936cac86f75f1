#!/usr/bin/env python
"""Our runtime vs z-lab's reference `dflash_generate` (PyPI dflash==0.1.0) on the same pair and prompts.

Both decode each prompt greedily at batch 1 on this machine, alternating, in fp32; the script
checks the tokens are identical and prints the wall-time ratio (goal: >= 1.5x faster).

    python scripts/compare_reference.py [--target DIR --draft DIR] [--num-prompts 16] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def load_reference(target_dir: Path, draft_dir: Path):
    import dflash.model as zlab
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, Qwen3Config

    zlab._cuda_time = time.perf_counter  # its stats timer calls torch.cuda.synchronize()
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    draft = zlab.DFlashDraftModel(Qwen3Config(**json.loads((draft_dir / "config.json").read_text()))).eval()
    draft.load_state_dict(load_file(str(draft_dir / "model.safetensors")), strict=False)
    return zlab, target, draft.float()


def main() -> None:
    from dflash_trt.bench.local import load_prompts
    from dflash_trt.engine.config import resolve_model_path
    from dflash_trt.runtime.local import load_pair
    from dflash_trt.spec.decode import speculative_generate
    from dflash_trt.spec.requests import Request, StopCriteria

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="builtin:tiny-qwen3")
    ap.add_argument("--draft", default="builtin:tiny-qwen3-dflash")
    ap.add_argument("--prompts", help="JSONL of prompts (default: the shipped held-out prompts)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--adaptive-cost", type=float, help="ours picks verify widths (spec/width.py); tokens stay identical")
    args = ap.parse_args()
    target_dir, draft_dir = resolve_model_path(args.target, Path.cwd()), resolve_model_path(args.draft, Path.cwd())
    pair = load_pair(target_dir, draft_dir, "fp32", "cpu")  # also pins CPU threads (DFLASH_TRT_CPU_THREADS)
    zlab, ref_target, ref_draft = load_reference(target_dir, draft_dir)
    prompts = load_prompts(args.prompts, pair.tokenizer, args.num_prompts)
    from dflash_trt.spec.width import AdaptiveWidth

    width = AdaptiveWidth(args.block_size, args.adaptive_cost) if args.adaptive_cost is not None else None
    ours_s = ref_s = 0.0
    identical, tokens = 0, 0
    with torch.inference_mode():
        for i, prompt in enumerate([prompts[0]] + prompts):  # the first run warms both up
            request = Request(tuple(prompt), stop=StopCriteria(args.max_new_tokens))
            t0 = time.perf_counter()
            ours = speculative_generate(pair.target, pair.draft, [request], args.block_size, width=width)[0].tokens
            t1 = time.perf_counter()
            ids = torch.tensor([prompt])
            ref = zlab.dflash_generate(ref_draft, ref_target, ids, args.max_new_tokens, None, 0.0,
                                       block_size=args.block_size)[0, len(prompt):].tolist()
            t2 = time.perf_counter()
            if i == 0:
                continue
            ours_s, ref_s = ours_s + t1 - t0, ref_s + t2 - t1
            identical += ours == ref
            tokens += len(ours)
    print(f"prompts {len(prompts)}, block size {args.block_size}, {tokens} tokens, torch threads {torch.get_num_threads()}")
    print(f"identical tokens: {identical}/{len(prompts)}")
    print(f"dflash-trt torch runtime: {ours_s:.2f} s ({tokens / ours_s:.1f} tok/s)")
    print(f"z-lab dflash_generate:    {ref_s:.2f} s ({tokens / ref_s:.1f} tok/s)")
    print(f"speed-up vs reference: {ref_s / ours_s:.2f}x")
    if identical != len(prompts):
        raise SystemExit("tokens differ from the reference")


if __name__ == "__main__":
    main()
