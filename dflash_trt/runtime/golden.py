"""Golden outputs decoded through a bundle's own runners, the way a server runs them.

At build time the filled folder is opened like a served bundle (runtime/backends.py `open_runners`), and
the golden prompts are decoded greedily with full blocks (width policy `schedule`, no confidence cut:
deterministic, and the drafter's acceptance at full blocks is what a regression should watch), then
autoregressively with the same target runner; engine/golden.py turns both into the manifest's block.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.engine.config import BuildConfig
from dflash_trt.engine.golden import golden_block, prompt_ids
from dflash_trt.runtime.backends import open_runners
from dflash_trt.runtime.generate import Engine
from dflash_trt.runtime.scheduler import ServiceLimits


def bundle_golden(cfg: BuildConfig, folder: Path, info: dict, log=print) -> dict:
    """The manifest's `golden` block for the bundle being built in `folder` (`info`: its pair_info)."""
    from dflash_trt.tokenizer import has_tokenizer, load_tokenizer

    tokenizer = load_tokenizer(folder / "target") if has_tokenizer(folder / "target") else None
    prompts = prompt_ids(cfg.golden.prompts, tokenizer, cfg.source)
    block = info["block_size"]
    limits = ServiceLimits(cfg.runtime.max_batch_size, max(map(len, prompts)) + cfg.golden.max_new_tokens, block,
                           width_policy="schedule")
    manifest = {"backend": cfg.backend, "format": info.get("format"), "config": cfg.to_dict()}
    device = "cpu" if cfg.backend == "torch" else None  # torch bundles record their goldens on this machine's CPU
    log(f"golden outputs ({len(prompts)} prompts, {cfg.golden.max_new_tokens} tokens, {cfg.backend} runners)")
    runners = open_runners(folder, limits, device, manifest)
    requests = [Request(tuple(p), stop=StopCriteria(cfg.golden.max_new_tokens)) for p in prompts]
    try:
        spec = Engine(runners.target, runners.draft, limits).generate(requests)
        ar = Engine(runners.target, None, replace(limits, block_size=1)).generate(requests)
    finally:
        runners.shutdown()
    return golden_block(prompts, spec, ar, cfg.golden.max_new_tokens, block)
