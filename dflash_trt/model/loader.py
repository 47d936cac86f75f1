"""Build torch modules from checked checkpoints (HF names load as-is; safetensors only), and load a
target + drafter pair onto a device (`load_pair`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from dflash_trt.checkpoint.hf import DraftCheckpoint, TargetCheckpoint, check_pair, read_draft, read_target
from dflash_trt.errors import ConfigError
from dflash_trt.model.draft import DFlashDraft
from dflash_trt.model.layers import Rotary
from dflash_trt.model.target import Target
from dflash_trt.tokenizer import has_tokenizer, load_tokenizer

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _load(module: torch.nn.Module, state: dict, device) -> torch.nn.Module:
    """Fill a meta-device module from `state` (strict), with RoPE buffers rebuilt for real."""
    dims = module.config.dims
    module.load_state_dict(state, strict=True, assign=True)
    module.rotary = Rotary(dims.rope, dims.head_dim)  # non-persistent buffer: no data on meta
    return module.to(device).eval().requires_grad_(False)


def _held(state: dict, hold: torch.dtype | None) -> dict:
    """Weights rounded to their load dtype, then held in `hold` (exactly: `held_dtype`)."""
    return state if hold is None else {k: v.to(hold) for k, v in state.items()}


def load_target(ckpt: TargetCheckpoint, dtype: torch.dtype = torch.float32, device="cpu", fuse: bool = True,
                hold: torch.dtype | None = None) -> Target:
    """A Target from a checked HF checkpoint; `fuse` joins q/k/v and gate/up matmuls (inference); `hold`:
    the dtype the `dtype`-rounded weights are kept in."""
    config = ckpt.config
    names = [n for n in ckpt.weights.names() if not n.endswith("rotary_emb.inv_freq")]
    state = _held(ckpt.weights.load(names, dtype), hold)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    with torch.device("meta"):
        target = Target(config)
    target = _load(target, state, device)
    if config.tie_word_embeddings:
        target.lm_head.weight = target.model.embed_tokens.weight
    return target.fuse() if fuse else target


def load_draft(ckpt: DraftCheckpoint, dtype: torch.dtype = torch.float32, device="cpu", fuse: bool = True,
               hold: torch.dtype | None = None) -> DFlashDraft:
    """A DFlashDraft from a checked z-lab checkpoint; `fuse` and `hold` as in `load_target`."""
    names = [n for n in ckpt.weights.names() if not n.endswith("rotary_emb.inv_freq")]
    with torch.device("meta"):
        draft = DFlashDraft(ckpt.config)
    draft = _load(draft, _held(ckpt.weights.load(names, dtype), hold), device)
    return draft.fuse() if fuse else draft


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
    """Threads for CPU decoding: DFLASH_TRT_CPU_THREADS, default 1; torch's intra-op threads
    (`resolve_device`) and the C++ passes' pool (backends/cpu/ops.py `follow_torch_threads`). Decode steps
    are many small torch ops, which stall on a shared machine with several OpenMP threads whenever another
    process is busy; the C++ passes split their weight streams and gain from a second core that is free."""
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


def held_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype | None:
    """bf16 / fp16 weights on CPU are held as their exact fp32 expansion (every bf16 / fp16 value is an fp32
    value), so the CPU backend's fp32 C++ layer runs them: fp32 activations and accumulation in an order
    independent of the row count — a verify row is a decode row bit for bit, whatever shares the batch.
    The weights' values are the checkpoint's in its dtype (the C++ layer streams them as 16-bit panels);
    only their memory is fp32. Other devices keep theirs."""
    return torch.float32 if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16) else None


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
    return LoadedPair(target, draft, tokenizer, Path(target_dir), Path(draft_dir) if draft_dir else None)


def apply_draft_vocab(pair: LoadedPair, size: int | str | None) -> LoadedPair:
    """Let the drafter propose from its draft vocabulary (draft_vocab.py): `size` None / 0 / "full" = every
    token, "auto" = the drafter's recommended size when it has a vocabulary file, N = the N most frequent.
    Lossless at any size (proposals only)."""
    from dflash_trt.model import draft_vocab

    if pair.draft is None:
        return pair
    ids = draft_vocab.token_ids(pair.draft_dir, size, pair.target.config.vocab_size, str(pair.draft_dir))
    pair.draft.use_vocab(ids, pair.target.lm_head)
    return pair
