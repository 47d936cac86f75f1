"""`dflash-trt bench`: DFlash vs autoregressive decoding measured side by side in one run."""

from __future__ import annotations

import json

import click

from dflash_trt.cli_types import INT_LIST


@click.command("bench", short_help="Benchmark DFlash against autoregressive decoding (local or served).")
@click.option("--target", default="builtin:tiny-qwen3", show_default=True)
@click.option("--draft", default="builtin:tiny-qwen3-dflash", show_default=True)
@click.option("--prompts", "prompts_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL with token_ids or text per line (default: the shipped held-out prompts).")
@click.option("--num-prompts", type=click.IntRange(min=1), default=16, show_default=True)
@click.option("--block-sizes", type=INT_LIST, default="8,16", show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True)
@click.option("--json-out", type=click.Path(dir_okay=False), help="Write the results as JSON here.")
def bench_command(target, draft, prompts_path, num_prompts, block_sizes, max_new_tokens, temperature, seed,
                  device, json_out):
    """Batch-1 decoding of the same prompts both ways, alternating, on one runtime: τ, tokens/s, speed-up."""
    from dflash_trt.bench.report import print_local
    from dflash_trt.bench.runner import run_local

    results = run_local(target, draft, prompts_path, num_prompts, block_sizes, max_new_tokens, temperature,
                        seed, device)
    print_local(results)
    if json_out:
        with open(json_out, "w") as f:
            json.dump({"mode": "local", "results": [r.to_dict() for r in results]}, f, indent=2)
