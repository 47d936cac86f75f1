"""Build torch modules from checked checkpoints (HF names load as-is; safetensors only)."""

from __future__ import annotations

import torch

from dflash_trt.checkpoint.hf import DraftCheckpoint, TargetCheckpoint
from dflash_trt.model.draft import DFlashDraft
from dflash_trt.model.layers import Rotary
from dflash_trt.model.target import Target

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _load(module: torch.nn.Module, state: dict, device) -> torch.nn.Module:
    """Fill a meta-device module from `state` (strict), with RoPE buffers rebuilt for real."""
    dims = module.config.dims
    module.load_state_dict(state, strict=True, assign=True)
    module.rotary = Rotary(dims.rope, dims.head_dim)  # non-persistent buffer: no data on meta
    return module.to(device).eval().requires_grad_(False)


def _held(state: dict, hold: torch.dtype | None) -> dict:
    """Weights rounded to their load dtype, then held in `hold` (exactly: runtime/local.py `held_dtype`)."""
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
