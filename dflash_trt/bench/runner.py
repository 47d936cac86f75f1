"""Bench orchestration: load the pair, warm up, run each block size with a progress bar."""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_trt.bench.local import BlockResult, bench_block_size, load_prompts, warm_up
from dflash_trt.engine.config import resolve_model_path
from dflash_trt.runtime.local import load_pair
from dflash_trt.spec.sampling import SamplingParams
from dflash_trt.tokenizer import stop_token_ids


def run_local(target, draft, prompts_path, num_prompts, block_sizes, max_new_tokens, temperature, seed,
              device) -> list[BlockResult]:
    from rich.progress import Progress

    pair = load_pair(resolve_model_path(target, Path.cwd()), resolve_model_path(draft, Path.cwd()), "fp32", device)
    torch.set_grad_enabled(False)
    prompts = load_prompts(prompts_path, pair.tokenizer, num_prompts)
    stop_ids = stop_token_ids(pair.tokenizer, pair.target.config.eos_token_ids)
    warm_up(pair, prompts[0], max(block_sizes))
    results = []
    with Progress() as progress:
        for block_size in block_sizes:
            task = progress.add_task(f"block size {block_size}", total=len(prompts))
            params = SamplingParams(temperature, seed=seed)
            results.append(bench_block_size(pair, prompts, block_size, max_new_tokens, params, stop_ids,
                                            lambda: progress.advance(task)))
    return results
