"""Backend `torch`, bundles: the HF target and z-lab drafter as they are, or quantized.

Unquantized, target/ and draft/ are the HF folders; quantized (FP8 / NVFP4 / FP8 KV), they are the
TensorRT-LLM checkpoint pair from the convert stage, which the torch models run dequantized with
simulated activation / KV quantization (parallel.py) — the very artifact a GPU engine build consumes.
Dtype and device are load settings recorded in the config. `load_bundle` opens such a bundle as a
loaded pair; its runners are the torch backend's on CUDA and the CPU backend's on CPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dflash_trt.checkpoint.hf import read_draft, read_target
from dflash_trt.engine import bundle as bundles
from dflash_trt.engine.backend import FilledBundle, Log
from dflash_trt.engine.config import BuildConfig
from dflash_trt.errors import ConfigError
from dflash_trt.model.loader import LoadedPair, apply_draft_vocab, load_pair

HF_FORMAT, TRTLLM_FORMAT = "hf", "trtllm-checkpoint"


class TorchBackend:
    name = "torch"

    def fill(self, cfg: BuildConfig, tmp: Path, log: Log) -> FilledBundle:
        fmt = _stage_weights(cfg, tmp, log)
        return FilledBundle(pair_info(*_configs(tmp, fmt), cfg.block_size, tmp) | {"format": fmt})


def _quantized(cfg: BuildConfig) -> bool:
    return cfg.quant != "none" or cfg.kv_cache == "fp8"


def _stage_weights(cfg: BuildConfig, tmp: Path, log: Log) -> str:
    """Put what the runtime loads into tmp/target and tmp/draft; returns the bundle's weight format."""
    if not _quantized(cfg):
        log(f"copying target {cfg.target_path()} and drafter {cfg.draft_path()}")
        bundles.copy_model(cfg.target_path(), tmp / "target")
        bundles.copy_model(cfg.draft_path(), tmp / "draft")
        return HF_FORMAT
    from dflash_trt.convert import ConvertConfig, convert

    log(f"converting to a TensorRT-LLM checkpoint pair (quant {cfg.quant}, kv cache {cfg.kv_cache})")
    dtype = "bf16" if cfg.dtype == "auto" else cfg.dtype
    result = convert(ConvertConfig(str(cfg.target_path()), str(cfg.draft_path()), str(tmp / "checkpoint"), dtype=dtype,
                                   quant=cfg.quant, kv_cache="fp8" if cfg.kv_cache == "fp8" else "none", tp=cfg.tp))
    for kind in ("target", "draft"):
        (result.out / kind).rename(tmp / kind)
    shutil.rmtree(result.out)
    return TRTLLM_FORMAT


def _configs(folder: Path, fmt: str):
    """The staged target's and drafter's configs (TargetConfig, DraftConfig), weights unread."""
    if fmt == TRTLLM_FORMAT:
        from dflash_trt.checkpoint.trtllm import read_trtllm

        return read_trtllm(folder / "target").config.model, read_trtllm(folder / "draft").config.model
    return read_target(folder / "target").config, read_draft(folder / "draft").config


def load_staged(folder: Path, fmt: str, dtype: str, device: str, draft_vocab_size=None) -> LoadedPair:
    """The pair a bundle folder holds (`fmt`: HF folders or a TensorRT-LLM checkpoint pair)."""
    if fmt == TRTLLM_FORMAT:
        from dflash_trt.backends.torch.parallel import load_trtllm_pair

        pair = load_trtllm_pair(folder / "target", folder / "draft", dtype=dtype, device=device, simulate=True)
    else:
        pair = load_pair(folder / "target", folder / "draft", dtype, device)
    return apply_draft_vocab(pair, draft_vocab_size)


def pair_info(target, draft, block_size: int | None, folder: Path) -> dict:
    """The manifest's description of a pair from its configs (`block_size` None: the drafter's)."""
    from dflash_trt.tokenizer import has_tokenizer

    return {
        "block_size": block_size or draft.block_size,
        "mask_token_id": draft.mask_token_id,
        "target_layer_ids": list(draft.target_layer_ids),
        "target": {"family": target.family, "vocab_size": target.vocab_size, "num_layers": target.dims.num_layers},
        "draft": {"num_layers": draft.dims.num_layers, "trained_block_size": draft.block_size},
        "has_tokenizer": has_tokenizer(folder / "target"),
    }


def load_bundle(path: str | Path, dtype: str | None = None, device: str | None = None, verify: bool = True):
    """Verify a torch bundle's hashes and load its pair; returns (manifest, LoadedPair)."""
    path = Path(path)
    manifest = bundles.verify_bundle(path) if verify else bundles.read_manifest(path)
    if manifest.get("backend", "torch") != "torch":
        raise ConfigError(f"{path}: a {manifest['backend']} bundle is served through its own runners "
                          "(dflash_trt.runtime.backends.open_runners), not loaded as a torch pair")
    config = manifest["config"]
    pair = load_staged(path, manifest.get("format", HF_FORMAT), dtype or config["dtype"],
                       device or config["runtime"]["device"], config["runtime"].get("draft_vocab_size"))
    return manifest, pair
