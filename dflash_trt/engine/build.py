"""`dflash-trt build`: check inputs -> (convert) -> bundle with manifest + golden outputs.

Backend `torch` bundles the HF target and z-lab drafter as they are (dtype and device are load
settings recorded in the config). Backend `trtllm` needs TensorRT-LLM (see docs/trtllm-backend.md).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from dflash_trt.checkpoint.hf import check_pair, read_draft, read_target
from dflash_trt.engine import bundle as bundles
from dflash_trt.engine.config import BuildConfig
from dflash_trt.engine.golden import compute_golden, prompt_ids
from dflash_trt.errors import ConfigError
from dflash_trt.model import draft_vocab
from dflash_trt.runtime.local import LoadedPair, apply_draft_vocab, load_pair

HF_FORMAT, TRTLLM_FORMAT = "hf", "trtllm-checkpoint"




def _quantized(cfg: BuildConfig) -> bool:
    return cfg.quant != "none" or cfg.kv_cache == "fp8"


def _stage_weights(cfg: BuildConfig, tmp: Path, log) -> str:
    """Put what the runtime loads into tmp/target and tmp/draft; returns the bundle's weight format.

    Unquantized: the HF folders as they are. Quantized (FP8 / NVFP4 / FP8 KV): the TensorRT-LLM
    checkpoint pair from `dflash-trt convert`, which the torch runtime runs dequantized with simulated
    activation / KV quantization — the very artifact a GPU engine build consumes.
    """
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


def _load_staged(folder: Path, fmt: str, dtype: str, device: str, draft_vocab_size=None) -> LoadedPair:
    if fmt == TRTLLM_FORMAT:
        from dflash_trt.runtime.tp import load_trtllm_pair

        pair = load_trtllm_pair(folder / "target", folder / "draft", dtype=dtype, device=device, simulate=True)
    else:
        pair = load_pair(folder / "target", folder / "draft", dtype, device)
    return apply_draft_vocab(pair, draft_vocab_size)


def build_bundle(cfg: BuildConfig, log=print) -> tuple[Path, dict, bool]:
    """Build (or reuse) the bundle for `cfg`; returns (path, manifest, reused)."""
    t0 = time.perf_counter()
    target_ckpt, draft_ckpt = read_target(cfg.target_path()), read_draft(cfg.draft_path())
    check_pair(target_ckpt, draft_ckpt)
    draft_vocab.token_ids(cfg.draft_path(), cfg.runtime.draft_vocab_size, target_ckpt.config.vocab_size,
                          f"{cfg.source}: field 'runtime.draft_vocab_size'")
    fingerprint = bundles.input_fingerprint(cfg)
    existing = bundles.reusable(cfg, fingerprint)
    if existing is not None:
        log(f"unchanged config and inputs: reusing {existing}")
        return existing, bundles.read_manifest(existing), True

    def fill(tmp: Path) -> None:
        if cfg.backend == "trtllm":  # paired TensorRT-LLM / TensorRT engines (docs/trtllm-backend.md)
            from dflash_trt.trtllm.build import build_trtllm_bundle

            built = build_trtllm_bundle(cfg, tmp, log)
            if not built["golden"]["matches_autoregressive"]:
                raise ConfigError(f"{cfg.source}: engine output differs from autoregressive output (report it)")
            bundles.write_manifest(tmp, cfg, fingerprint, built["pair_info"] | {"format": "trtllm-engines"},
                                   built["golden"], time.perf_counter() - t0, built.get("versions"))
            return
        fmt = _stage_weights(cfg, tmp, log)
        pair = _load_staged(tmp, fmt, "fp32" if cfg.dtype == "auto" else cfg.dtype, "cpu", cfg.runtime.draft_vocab_size)
        block_size = cfg.block_size or pair.draft.config.block_size
        log(f"golden outputs ({len(cfg.golden.prompts)} prompt entries, {cfg.golden.max_new_tokens} tokens)")
        prompts = prompt_ids(cfg.golden.prompts, pair.tokenizer, cfg.source)
        golden = compute_golden(pair, prompts, cfg.golden.max_new_tokens, block_size)
        if not golden["matches_autoregressive"]:
            raise ConfigError(f"{cfg.source}: speculative output differs from autoregressive output (a bug: report it)")
        info = pair_info(pair, block_size) | {"format": fmt}
        bundles.write_manifest(tmp, cfg, fingerprint, info, golden, time.perf_counter() - t0)

    out = bundles.write_atomically(cfg.output_path(), fill)
    return out, bundles.read_manifest(out), False


def pair_info(pair: LoadedPair, block_size: int) -> dict:
    d = pair.draft.config
    return {
        "block_size": block_size,
        "mask_token_id": d.mask_token_id,
        "target_layer_ids": list(d.target_layer_ids),
        "target": {"family": pair.target.config.family, "vocab_size": pair.target.config.vocab_size,
                   "num_layers": pair.target.config.dims.num_layers},
        "draft": {"num_layers": d.dims.num_layers, "trained_block_size": d.block_size},
        "has_tokenizer": pair.tokenizer is not None,
    }


def load_bundle(path: str | Path, dtype: str | None = None, device: str | None = None, verify: bool = True):
    """Verify a bundle's hashes and load its pair; returns (manifest, LoadedPair)."""
    path = Path(path)
    manifest = bundles.verify_bundle(path) if verify else bundles.read_manifest(path)
    if manifest.get("format_version") != bundles.FORMAT_VERSION:
        raise ConfigError(f"{path / 'manifest.json'}: field 'format_version': {manifest.get('format_version')} "
                          f"is not {bundles.FORMAT_VERSION}; rebuild with this dflash-trt")
    if manifest.get("backend") == "trtllm":
        raise ConfigError(f"{path}: a trtllm engine bundle is served through its runners "
                          "(dflash_trt.trtllm.runner.load_trtllm_runners), not loaded as a torch pair")
    config = manifest["config"]
    pair = _load_staged(path, manifest.get("format", HF_FORMAT), dtype or config["dtype"],
                        device or config["runtime"]["device"], config["runtime"].get("draft_vocab_size"))
    return manifest, pair
