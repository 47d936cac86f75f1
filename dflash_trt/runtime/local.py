"""Local generation: a loaded pair decoded through the engine in the caller's thread.

`generate` is what `dflash-trt generate` and the tests' local decodes call: the loaded pair's runners
(the backend its device picks: runtime/backends.py), a scheduler and its synchronous driver
(generate.Engine), so a local decode takes exactly the steps a server would.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.requests import GenerationResult, OnCommit, Request
from dflash_trt.decoding.stats import DecodeStats
from dflash_trt.model.loader import LoadedPair
from dflash_trt.runtime.generate import Engine, capacity_for
from dflash_trt.runtime.scheduler import ServiceLimits


def default_draft_confidence(device: str | torch.device) -> float:
    """The confidence cut when none is given: on CPU each extra verified row costs (0.1), GPUs verify a full
    block for about the price of one row (0 = full blocks)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return 0.1 if torch.device(device).type == "cpu" else 0.0


def local_engine(pair: LoadedPair, max_seq_len: int, block_size: int | None = None, autoregressive: bool = False,
                 min_confidence: float = 0.0, width_policy: str = "auto", max_batch_size: int = 8,
                 prefix_cache_bytes: int = 0, cuda_graphs: bool = True) -> Engine:
    """An engine over `pair` (autoregressive without a drafter, or when asked) for requests of up to
    `max_seq_len` tokens; `block_size` defaults to the drafter's; a prefix cache of `prefix_cache_bytes`."""
    from dflash_trt.runtime.backends import pair_runners

    block = 1 if autoregressive or pair.draft is None else (block_size or pair.draft.config.block_size)
    limits = ServiceLimits(max_batch_size, max_seq_len, block, draft_confidence=min_confidence,
                           width_policy=width_policy, prefix_cache_bytes=prefix_cache_bytes, cuda_graphs=cuda_graphs)
    target, draft = pair_runners(pair, limits)
    return Engine(target, draft, limits, pair.detokenize if pair.tokenizer is not None else None)


def generate(pair: LoadedPair, requests: list[Request], block_size: int | None = None, autoregressive: bool = False,
             on_commit: OnCommit | None = None, min_confidence: float = 0.0,
             width_policy: str = "auto") -> tuple[list[GenerationResult], DecodeStats]:
    """Decode with DFlash (or plain AR when `autoregressive`) through the engine; results plus statistics."""
    engine = local_engine(pair, capacity_for(requests), block_size, autoregressive, min_confidence, width_policy,
                          max_batch_size=len(requests))
    return engine.generate_with_stats(requests, on_commit)
