"""Write a drafter as a z-lab DFlash folder: config.json (+ dflash_config) and model.safetensors.

The folder loads in our runtime (`read_draft`) and in z-lab's `dflash==0.1.0`
(`DFlashDraftModel(Qwen3Config(**config))` + the safetensors state dict). The write is atomic:
files go to a temporary sibling folder that is renamed into place when complete.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from dflash_trt.atomic import check_replaceable, write_atomically
from dflash_trt.checkpoint.configs import DraftConfig, TargetConfig


def draft_config_json(config: DraftConfig, torch_dtype: str = "float32") -> dict:
    """The z-lab `config.json` for a drafter (Qwen3 backbone keys + `dflash_config`)."""
    d = config.dims
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": config.block_size,
        "dflash_config": {
            "target_layer_ids": list(config.target_layer_ids),
            "mask_token_id": config.mask_token_id,
        },
        "num_target_layers": config.num_target_layers,
        "num_hidden_layers": d.num_layers,
        "hidden_size": d.hidden_size,
        "intermediate_size": d.intermediate_size,
        "num_attention_heads": d.num_heads,
        "num_key_value_heads": d.num_kv_heads,
        "head_dim": d.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": d.rms_norm_eps,
        "rope_theta": d.rope.theta,
        "rope_parameters": d.rope.hf_parameters(),  # a drafter trained with its target's yarn keeps it
        "attention_bias": d.attention_bias,
        "max_position_embeddings": d.max_position_embeddings,
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": False,
        "layer_types": list(config.layer_types),
        "use_sliding_window": config.sliding_window is not None,  # HF Qwen3Config drops the window without it
        "sliding_window": config.sliding_window,
        "torch_dtype": torch_dtype,
    } | ({} if config.is_causal is None else {"is_causal": config.is_causal})  # top level, as z-lab reads it


def draft_config_for_target(
    target: TargetConfig,
    num_layers: int,
    block_size: int,
    mask_token_id: int,
    target_layer_ids: tuple[int, ...],
    sliding_window: int | None = None,
) -> DraftConfig:
    """A drafter shaped like its target (z-lab copies the target's per-layer dimensions). With a
    `sliding_window`, every layer is z-lab's `sliding_attention`, not causal: a block attends to the context
    positions within the window before it (and its own rows), so a draft pass costs the same at any
    context length; a window no wider than the target's original rope window keeps plain rope (every
    distance the drafter sees is one the rope was trained at, so a long-context yarn scaling is not copied)."""
    dims = replace(target.dims, num_layers=num_layers, qk_norm=True, mlp_bias=False)
    rope = target.dims.rope
    if sliding_window is not None and rope.type == "yarn" and sliding_window <= rope.original_max_position_embeddings:
        dims = replace(dims, rope=replace(rope, type="default", factor=1.0))
    return DraftConfig(
        vocab_size=target.vocab_size,
        dims=dims,
        block_size=block_size,
        mask_token_id=mask_token_id,
        target_layer_ids=tuple(target_layer_ids),
        num_target_layers=target.dims.num_layers,
        layer_types=("full_attention" if sliding_window is None else "sliding_attention",) * num_layers,
        sliding_window=sliding_window,
        is_causal=None if sliding_window is None else False,
    )


def write_draft_folder(
    folder: str | Path,
    config: DraftConfig,
    state_dict: dict[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
    extra_files: dict[str, str] | None = None,
) -> Path:
    """Atomically write config.json, model.safetensors and `extra_files` (name -> text)."""
    folder = Path(folder)

    def fill(tmp: Path) -> None:
        dtype_name = str(dtype).removeprefix("torch.")
        (tmp / "config.json").write_text(json.dumps(draft_config_json(config, dtype_name), indent=2) + "\n")
        tensors = {k: v.detach().to(dtype).contiguous() for k, v in state_dict.items()}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name, text in (extra_files or {}).items():
            (tmp / name).write_text(text)

    write_atomically(folder, fill, owned=is_written_drafter, what="drafter folder")
    return folder


TRAIN_RECORD = "dflash_trt_train.json"  # train-draft's settings: what marks a drafter folder as ours


def is_written_drafter(folder: Path) -> bool:
    """A drafter folder `train-draft` wrote (its settings file is there): one it may replace."""
    return (Path(folder) / TRAIN_RECORD).is_file() and (Path(folder) / "config.json").is_file()


def check_drafter_out(folder: str | Path) -> None:
    """Before training: refuse an output folder that is not empty and not a drafter train-draft wrote."""
    check_replaceable(Path(folder), is_written_drafter, "drafter folder")
