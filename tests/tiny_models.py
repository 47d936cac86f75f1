"""Tiny random HF targets and z-lab DFlash drafters built in code (no hub), saved as folders."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def target_hf_config(family: str = "qwen3", **overrides):
    from transformers import LlamaConfig, Qwen3Config

    base = dict(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
        tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    base.update(overrides)
    config = (Qwen3Config if family == "qwen3" else LlamaConfig)(**base)
    config.architectures = ["Qwen3ForCausalLM" if family == "qwen3" else "LlamaForCausalLM"]
    return config


def make_target(folder: Path, family: str = "qwen3", seed: int = 0, **overrides):
    """Save a random HF target to `folder`; returns the HF model (fp32, eval)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(target_hf_config(family, **overrides)).eval()
    model.save_pretrained(folder)
    return model


def draft_config_dict(target_config, num_layers=2, block_size=8, target_layer_ids=(1, 2), mask_token_id=None, **extra):
    t = target_config
    d = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": block_size,
        "dflash_config": {
            "target_layer_ids": list(target_layer_ids),
            "mask_token_id": t.vocab_size - 1 if mask_token_id is None else mask_token_id,
        },
        "num_target_layers": t.num_hidden_layers,
        "num_hidden_layers": num_layers,
        "hidden_size": t.hidden_size,
        "intermediate_size": t.intermediate_size,
        "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads,
        "head_dim": t.head_dim,
        "rms_norm_eps": t.rms_norm_eps,
        "rope_theta": 10000.0,
        "max_position_embeddings": t.max_position_embeddings,
        "vocab_size": t.vocab_size,
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * num_layers,
        "sliding_window": None,
    }
    d.update(extra)
    return d


def oracle_draft(config: dict):
    """z-lab's reference `DFlashDraftModel` (PyPI dflash==0.1.0) built from a config dict."""
    from dflash.model import DFlashDraftModel
    from transformers import Qwen3Config

    return DFlashDraftModel(Qwen3Config(**config)).eval()


def make_draft(folder: Path, target_config, seed: int = 1, scale: float = 1.0, **kw):
    """Save a random z-lab-format drafter (config.json + model.safetensors); returns the oracle."""
    torch.manual_seed(seed)
    config = draft_config_dict(target_config, **kw)
    model = oracle_draft(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05 * scale)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    return model


def dflash2_config_dict(target_config, conv_kernel_size=2, conv_group_size=16, selector_rank=8, selector_top_k=4,
                        **kw):
    """A DFlash2 drafter config (z-lab tests/fixtures/dflash2-config.json's layout, tiny)."""
    config = draft_config_dict(target_config, **kw)
    config["architectures"] = ["DFlash2DraftModel"]
    config["dflash_config"] |= {"block_size": config.pop("block_size"), "conv_kernel_size": conv_kernel_size,
                                "conv_group_size": conv_group_size, "selector_rank": selector_rank,
                                "selector_top_k": selector_top_k}
    return config


def make_dflash2_draft(folder: Path, target_config, seed: int = 1, scale: float = 1.0, **kw):
    """Save a random DFlash2 drafter as z-lab ships them (codebooks without `.weight`); returns z-lab's
    `DFlash2DraftModel` (dflash==0.1.0) holding the same weights."""
    from dflash.model import DFlash2DraftModel
    from transformers import Qwen3Config

    torch.manual_seed(seed)
    config = dflash2_config_dict(target_config, **kw)
    model = DFlash2DraftModel(Qwen3Config(**config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("base_kernel"):
                p.normal_(0, 0.3 * scale)
            elif "candidate_selector" in name:  # a pairwise term that can overrule the unary argmax
                p.normal_(0, 0.5)
            elif p.dim() > 1:
                p.normal_(0, 0.05 * scale)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    state = {k.removesuffix(".weight") if "codebook" in k else k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "model.safetensors"))
    return model
