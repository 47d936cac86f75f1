#!/usr/bin/env python
"""Accuracy of FP8 / NVFP4 (and FP8 KV) TensorRT-LLM checkpoints against the BF16 checkpoint.

Each recipe is converted (the library behind `dflash-trt convert`), loaded by the torch runner with
simulated quantization (W8A8 FP8 / W4A4 NVFP4 GEMM inputs, FP8 KV rounding; arithmetic in fp32 on
CPU) and measured on the evaluation prompts:
  top-1   fraction of positions where the target's argmax equals the BF16 checkpoint's
          (teacher forced over every eval prompt)
  tau     mean acceptance length of greedy DFlash decoding of the eval prompts; d_tau = tau - tau(BF16)
Without --target/--draft a tiny RANDOM pair is built (random drafter: tau ~ 1, so d_tau says
nothing there); rerun on a trained pair, e.g. the shipped one:

    python scripts/quant_accuracy.py --target dflash_trt/assets/tiny-qwen3 --draft dflash_trt/assets/tiny-qwen3-dflash \\
        --eval-data dflash_trt/assets/heldout_prompts.jsonl --calib-data out/tiny_pair/draft_prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dflash_trt.backends.torch.parallel import load_trtllm_pair  # noqa: E402
from dflash_trt.checkpoint.configs import parse_draft_config  # noqa: E402
from dflash_trt.checkpoint.hf import draft_shapes, read_target  # noqa: E402
from dflash_trt.convert import ConvertConfig, convert  # noqa: E402
from dflash_trt.convert.calibrate import load_prompts, random_prompts  # noqa: E402
from dflash_trt.decoding.requests import Request, StopCriteria  # noqa: E402
from dflash_trt.runtime.local import generate  # noqa: E402
from dflash_trt.tokenizer import has_tokenizer, load_tokenizer  # noqa: E402

RECIPES = {  # name -> convert options (all stored in bf16 where not quantized)
    "bf16": {},
    "fp8": {"quant": "fp8"},
    "fp8 + fp8 kv": {"quant": "fp8", "kv_cache": "fp8"},
    "nvfp4": {"quant": "nvfp4"},
    "nvfp4 + fp8 kv": {"quant": "nvfp4", "kv_cache": "fp8"},
}


def build_random_pair(root: Path, seed: int = 0) -> tuple[Path, Path]:
    """A random Qwen3 target (4 layers, hidden 128, vocab 512) and a 2-layer z-lab-format drafter."""
    from safetensors.torch import save_file
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    dims = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
                head_dim=32, max_position_embeddings=1024, rms_norm_eps=1e-6, vocab_size=512)
    target = Qwen3ForCausalLM(Qwen3Config(num_hidden_layers=4, tie_word_embeddings=False, **dims))
    target.config.architectures = ["Qwen3ForCausalLM"]
    target.save_pretrained(root / "target")
    draft = {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "num_hidden_layers": 2,
             "num_target_layers": 4, "block_size": 8, "rope_theta": 10000.0,
             "dflash_config": {"target_layer_ids": [1, 2], "mask_token_id": 511}, **dims}
    (root / "draft").mkdir()
    (root / "draft" / "config.json").write_text(json.dumps(draft, indent=2))
    shapes = draft_shapes(parse_draft_config(draft, root / "draft" / "config.json"))
    state = {n: torch.randn(s) * 0.05 if len(s) > 1 else torch.ones(s) for n, s in shapes.items()}
    save_file(state, str(root / "draft" / "model.safetensors"))
    return root / "target", root / "draft"


def eval_prompts(args, vocab: int) -> list[tuple[int, ...]]:
    if args.eval_data is None:
        return random_prompts(args.prompts, args.prompt_len, vocab, seed=1234)
    tokenizer = load_tokenizer(args.target) if has_tokenizer(args.target) else None
    return load_prompts(args.eval_data, vocab, tokenizer, args.prompts)


@torch.inference_mode()
def argmax_tokens(pair, prompts) -> list[torch.Tensor]:
    """Teacher-forced argmax of the target at every position of every prompt."""
    out = []
    for prompt in prompts:
        device = pair.target.lm_head.weight.device
        ids, positions = torch.tensor([prompt], device=device), torch.arange(len(prompt), device=device)[None]
        cache = pair.target.new_cache(1, len(prompt))
        logits, _ = pair.target(ids, positions, cache, torch.tensor([0], device=device))
        out.append(logits[0].argmax(-1).cpu())
    return out


def evaluate(folder: Path, prompts, args) -> dict:
    pair = load_trtllm_pair(folder / "target", folder / "draft", dtype="fp32", device=args.device, simulate=True)
    requests = [Request(p, stop=StopCriteria(args.max_new_tokens)) for p in prompts]
    _, stats = generate(pair, requests, args.block_size)
    size = sum(f.stat().st_size for f in folder.glob("*/rank*.safetensors"))
    return {"argmax": argmax_tokens(pair, prompts), "tau": stats.mean_acceptance_length, "mb": size / 2**20}


def run_recipes(args, work: Path, prompts) -> dict[str, dict]:
    """Convert and evaluate every recipe; rows in RECIPES order (bf16 first)."""
    rows = {}
    for name, options in RECIPES.items():
        folder = work / name.replace(" + ", "_").replace(" ", "_")
        convert(ConvertConfig(str(args.target), str(args.draft), str(folder), dtype="bf16",
                              calib_data=str(args.calib_data) if args.calib_data else None,
                              calibrator=args.calibrator, **options))
        rows[name] = evaluate(folder, prompts, args)
    return rows


def table(rows: dict[str, dict]) -> str:
    base = rows["bf16"]
    lines = ["| recipe | checkpoint MB | top-1 agreement with BF16 | tau | d_tau vs BF16 |", "|---|---|---|---|---|"]
    for name, r in rows.items():
        agree = torch.cat([a == b for a, b in zip(r["argmax"], base["argmax"])]).float().mean().item()
        lines.append(f"| {name} | {r['mb']:.2f} | {agree:.4f} | {r['tau']:.3f} | {r['tau'] - base['tau']:+.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, help="HF target folder (default: a tiny random pair)")
    ap.add_argument("--draft", type=Path, help="z-lab DFlash drafter folder")
    ap.add_argument("--eval-data", type=Path, help=".jsonl / .txt eval prompts (default: random tokens)")
    ap.add_argument("--calib-data", type=Path, help=".jsonl / .txt calibration prompts (default: random tokens)")
    ap.add_argument("--prompts", type=int, default=16, help="eval prompts used")
    ap.add_argument("--prompt-len", type=int, default=64, help="length of random eval prompts")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--block-size", type=int, help="default: the drafter's")
    ap.add_argument("--calibrator", default="auto", choices=["auto", "builtin", "modelopt"])
    ap.add_argument("--work", type=Path, help="keep converted checkpoints here (default: a temp folder)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N (arithmetic stays fp32)")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads (tiny models run fastest on one)")
    args = ap.parse_args()
    if (args.target is None) != (args.draft is None):
        ap.error("give both --target and --draft, or neither")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.target is None:
            args.target, args.draft = build_random_pair(work / "random_pair")
        prompts = eval_prompts(args, read_target(args.target).config.vocab_size)
        t0 = time.perf_counter()
        rows = run_recipes(args, work, prompts)
        print(f"target {args.target}, drafter {args.draft}: {len(prompts)} eval prompts, "
              f"{args.max_new_tokens} new tokens each, {time.perf_counter() - t0:.0f} s\n")
        print(table(rows))


if __name__ == "__main__":
    main()
