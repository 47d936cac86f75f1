"""Local generation with the torch runtime: load a target + drafter pair and decode requests."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash_trt.checkpoint.hf import check_pair, read_draft, read_target
from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.decode import DecodeTimings, speculative_generate
from dflash_trt.decoding.requests import GenerationResult, OnCommit, Request
from dflash_trt.decoding.stats import DecodeStats
from dflash_trt.errors import ConfigError
from dflash_trt.model import cpu_ops
from dflash_trt.model.draft import DFlashDraft
from dflash_trt.model.loader import DTYPES, load_draft, load_target
from dflash_trt.model.target import Target
from dflash_trt.tokenizer import has_tokenizer, load_tokenizer


@dataclass
class LoadedPair:
    target: Target
    draft: DFlashDraft | None
    tokenizer: object | None
    target_dir: Path
    draft_dir: Path | None

    def detokenize(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


def cpu_threads() -> int:
    """Intra-op threads for CPU decoding: DFLASH_TRT_CPU_THREADS, default 1.

    Decode steps are many small ops; with 2+ OpenMP threads on a shared 2-core machine, barrier
    waits made each op 10-50x slower when another process was busy (measured: 16 tokens took
    10-20 s instead of 0.4 s). One thread is predictable; raise it on an idle many-core host.
    """
    return max(1, int(os.environ.get("DFLASH_TRT_CPU_THREADS", "1")))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        torch.set_num_threads(cpu_threads())
        return torch.device("cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: this torch build has no CUDA device; use --device cpu")
    if not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ConfigError(f"--device {device!r}: expected auto, cpu, cuda or cuda:N")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[dtype]


def load_pair(target_dir, draft_dir=None, dtype: str = "auto", device: str = "auto",
              native_dtype: bool = False) -> LoadedPair:
    """Read, check and load a target (and drafter); the tokenizer comes from the target folder.
    `native_dtype`: modules in `dtype` itself even on CPU (what a GPU build exports), not `held_dtype`."""
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    hold = None if native_dtype else held_dtype(torch_dtype, dev)
    target_ckpt = read_target(target_dir)
    draft = None
    if draft_dir is not None:
        draft_ckpt = read_draft(draft_dir)
        check_pair(target_ckpt, draft_ckpt)
        draft = load_draft(draft_ckpt, torch_dtype, dev, hold=hold)
    target = load_target(target_ckpt, torch_dtype, dev, hold=hold)
    tokenizer = load_tokenizer(target_dir) if has_tokenizer(target_dir) else None
    if dev.type == "cpu" and torch_dtype == torch.float32:
        cpu_ops.library()  # build (or load) the C++ layer now, not inside the first request
    return LoadedPair(target, draft, tokenizer, Path(target_dir), Path(draft_dir) if draft_dir else None)


def held_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype | None:
    """bf16 / fp16 weights on CPU are held as their exact fp32 expansion (every bf16 / fp16 value is an
    fp32 value), so the fp32 C++ layer runs them: fp32 activations and accumulation in an order independent
    of the row count — a verify row is a decode row bit for bit, whatever shares the batch (README,
    "Lossless by construction"). The weights' values are the checkpoint's in its dtype; only their memory is
    fp32 (a kernel reading bf16 panels would halve the weight stream: not yet). Other devices keep theirs."""
    return torch.float32 if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16) else None


def apply_draft_vocab(pair: LoadedPair, size: int | str | None) -> LoadedPair:
    """Let the drafter propose from its draft vocabulary (model/draft_vocab.py): `size` None / 0 /
    "full" = every token, "auto" = the drafter's recommended size when it has a vocabulary file, N = the
    N most frequent. Lossless at any size (proposals only)."""
    from dflash_trt.model import draft_vocab

    if pair.draft is None:
        return pair
    ids = draft_vocab.token_ids(pair.draft_dir, size, pair.target.config.vocab_size, str(pair.draft_dir))
    pair.draft.use_vocab(ids, pair.target.lm_head)
    return pair


def default_draft_confidence(device: str | torch.device) -> float:
    """The confidence cut when none is given: on CPU each extra verified row costs (0.1, measured with
    the C++ layer in docs/benchmarks.md); GPUs verify a full block for about the price of one row (0 =
    full blocks)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return 0.1 if torch.device(device).type == "cpu" else 0.0


def generate(
    pair: LoadedPair,
    requests: list[Request],
    block_size: int | None = None,
    autoregressive: bool = False,
    on_commit: OnCommit | None = None,
    min_confidence: float = 0.0,
) -> tuple[list[GenerationResult], DecodeStats]:
    """Decode with DFlash (or plain AR when `autoregressive`); results plus statistics."""
    detokenize = pair.detokenize if pair.tokenizer is not None else None
    if autoregressive or pair.draft is None:
        t0 = time.perf_counter()
        results = autoregressive_generate(pair.target, requests, detokenize, on_commit)
        return results, DecodeStats.of(results, 1, 0.0, time.perf_counter() - t0)
    block_size = block_size or pair.draft.config.block_size
    timings = DecodeTimings()
    results = speculative_generate(pair.target, pair.draft, requests, block_size, detokenize, on_commit, timings,
                                   min_confidence=min_confidence)
    return results, DecodeStats.of(results, block_size, timings.prefill_s, timings.decode_s)
