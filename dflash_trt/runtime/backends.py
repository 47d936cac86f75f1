"""Backends by name: what fills a bundle and what runs one.

The one module that names the backends (`torch`, `trtllm`; engine/config.py `BACKENDS`). They are
siblings behind two contracts: the build contract (engine/backend.py, filled by
engine/torch_backend.py and trtllm/build.py) and the runner contract (runtime/runner.py, met by the
torch runners and trtllm/runner.py). The CLI builds through `build`; the Triton orchestrator serves
through `open_runners` and never imports a backend. GPU stacks are imported only when a trtllm
bundle is built or opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dflash_trt.engine import bundle as bundles
from dflash_trt.engine.backend import BundleBackend, Log
from dflash_trt.engine.build import build_bundle
from dflash_trt.engine.config import BACKENDS, BuildConfig
from dflash_trt.errors import ConfigError
from dflash_trt.runtime.runner import DraftRunner, TargetRunner
from dflash_trt.runtime.service import ServiceLimits, torch_runners


def bundle_backend(name: str) -> BundleBackend:
    """The backend that fills bundles for the config value `backend: name`."""
    if name == "torch":
        from dflash_trt.engine.torch_backend import TorchBackend

        return TorchBackend()
    if name == "trtllm":
        from dflash_trt.trtllm.build import TrtllmBackend

        return TrtllmBackend()
    raise ConfigError(f"field 'backend': {name!r} is not one of {', '.join(BACKENDS)}")


def build(cfg: BuildConfig, log: Log = print) -> tuple[Path, dict, bool]:
    """Build (or reuse) the bundle for `cfg` with its backend; returns (path, manifest, reused)."""
    return build_bundle(cfg, bundle_backend(cfg.backend), log)


@dataclass
class BundleRunners:
    """A bundle opened for serving: runners for the scheduler plus what requests are checked against."""

    target: TargetRunner
    draft: DraftRunner | None  # None when limits.block_size is 1 (autoregressive)
    tokenizer: object | None  # a `tokenizers`-backed tokenizer, or None (token ids only)
    vocab_size: int
    eos_ids: frozenset[int]
    detokenize: Callable[[list[int]], str] | None


def open_runners(bundle: str | Path, limits: ServiceLimits, device: str | None = None,
                 manifest: dict | None = None) -> BundleRunners:
    """The runners of a built bundle, whatever its backend (the manifest says which)."""
    manifest = manifest if manifest is not None else bundles.read_manifest(Path(bundle))
    backend = manifest.get("backend", "torch")
    if backend == "torch":
        return _torch_runners(bundle, limits, device)
    if backend == "trtllm":
        return _trtllm_runners(bundle, limits)
    raise ConfigError(f"{Path(bundle) / 'manifest.json'}: field 'backend': {backend!r} is not one of "
                      f"{', '.join(BACKENDS)}")


def _torch_runners(bundle, limits: ServiceLimits, device: str | None) -> BundleRunners:
    from dflash_trt.engine.torch_backend import load_bundle

    _, pair = load_bundle(bundle, device=device, verify=False)
    target, draft = torch_runners(pair, limits)
    detokenize = pair.detokenize if pair.tokenizer is not None else None
    return BundleRunners(target, draft, pair.tokenizer, pair.target.config.vocab_size,
                         eos_ids(pair.target.config.eos_token_ids, pair.tokenizer), detokenize)


def _trtllm_runners(bundle, limits: ServiceLimits) -> BundleRunners:
    """TensorRT-LLM target + TensorRT draft runners (docs/trtllm-backend.md)."""
    from dflash_trt.tokenizer import has_tokenizer, load_tokenizer
    from dflash_trt.trtllm.runner import load_trtllm_runners

    target, draft = load_trtllm_runners(bundle, limits.max_batch_size)
    folder = Path(bundle) / "target"
    tokenizer = load_tokenizer(folder) if has_tokenizer(folder) else None
    detokenize = (lambda ids: tokenizer.decode(ids, skip_special_tokens=True)) if tokenizer else None
    return BundleRunners(target, draft if limits.block_size != 1 else None, tokenizer, target.vocab_size,
                         eos_ids(_hf_eos(folder), tokenizer), detokenize)


def _hf_eos(folder: Path) -> tuple[int, ...]:
    """The target's EOS ids in a TensorRT-LLM bundle: hf_config.json's, then generation_config.json's."""
    from dflash_trt.checkpoint.configs import eos_field, joined_eos
    from dflash_trt.checkpoint.json_fields import Fields, load_json

    path = folder / "hf_config.json"
    return joined_eos(eos_field(Fields(load_json(path), path)) if path.is_file() else (), folder)


def eos_ids(config_eos, tokenizer) -> frozenset[int]:
    """The model config's EOS ids plus the tokenizer's."""
    ids = set(config_eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)
