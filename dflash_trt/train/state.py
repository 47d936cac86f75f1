"""Resumable training state as safetensors + JSON (never pickle): weights, AdamW moments, step."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from dflash_trt.errors import ConfigError

# Settings that change the meaning of a saved state; resuming across them is refused.
_IDENTITY = ("target", "block_size", "layers", "target_layer_ids", "mask_token_id", "seq_len", "seed", "lr", "steps")


def _identity(cfg) -> dict:
    identity = {k: getattr(cfg, k) for k in _IDENTITY}
    if getattr(cfg, "init", None) is not None:  # absent when unset: states saved before --init existed still resume
        identity["init"] = cfg.init
    if getattr(cfg, "eval_samples", 0):  # likewise: states from before held-out evaluation still resume
        identity["eval_samples"] = cfg.eval_samples
    if getattr(cfg, "sliding_window", None) is not None:  # likewise for a windowed drafter
        identity["sliding_window"] = cfg.sliding_window
    if getattr(cfg, "data_as_is", None):  # likewise for data used as it is
        identity["data_as_is"] = list(cfg.data_as_is)
    return identity


def save(state_dir: Path, cfg, draft: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    names = {id(p): n for n, p in draft.named_parameters()}
    moments = {}
    for group in optimizer.param_groups:
        for p in group["params"]:
            s = optimizer.state.get(p)
            if s:
                moments[f"{names[id(p)]}.exp_avg"] = s["exp_avg"].contiguous()
                moments[f"{names[id(p)]}.exp_avg_sq"] = s["exp_avg_sq"].contiguous()
                moments[f"{names[id(p)]}.step"] = torch.as_tensor(s["step"], dtype=torch.float32).reshape(1)
    tmp = state_dir / ".tmp"
    tmp.mkdir(exist_ok=True)
    save_file({k: v.contiguous() for k, v in draft.state_dict().items()}, str(tmp / "draft.safetensors"))
    save_file(moments, str(tmp / "optimizer.safetensors"))
    (tmp / "state.json").write_text(json.dumps({"step": step, "config": _identity(cfg)}, indent=2))
    for name in ("draft.safetensors", "optimizer.safetensors", "state.json"):  # state.json last: the commit
        os.replace(tmp / name, state_dir / name)


def load(state_dir: Path, cfg, draft: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore a saved state; returns the step to continue from (0 when there is none)."""
    meta_path = state_dir / "state.json"
    if not meta_path.is_file():
        return 0
    meta = json.loads(meta_path.read_text())
    if meta.get("config") != json.loads(json.dumps(_identity(cfg))):
        raise ConfigError(
            f"{meta_path}: saved training state was made with other settings {meta.get('config')}; "
            f"delete {state_dir} to start over"
        )
    draft.load_state_dict(load_file(str(state_dir / "draft.safetensors")))
    moments = load_file(str(state_dir / "optimizer.safetensors"))
    for name, p in draft.named_parameters():
        if f"{name}.exp_avg" in moments:
            optimizer.state[p] = {
                "step": moments[f"{name}.step"][0].clone(),
                "exp_avg": moments[f"{name}.exp_avg"].to(p.device),
                "exp_avg_sq": moments[f"{name}.exp_avg_sq"].to(p.device),
            }
    return int(meta["step"])
