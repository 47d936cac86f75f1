"""Backends by name: what fills a bundle, what runs one, and which runners a loaded pair gets.

The one module that names the backends (dflash_trt/backends: `torch`, `cpu`, `trtllm`). They are
siblings behind two contracts: the build contract (engine/backend.py) and the runner contract
(runtime/runner.py). A loaded torch pair runs on the CPU backend on CPU and on the torch backend
elsewhere (`pair_runners`), each with the verification bodies `kernels.select` picks for its device.
The Triton orchestrator serves through `open_runners` and never imports a backend. GPU stacks are
imported only when a trtllm bundle is built or opened.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dflash_trt.engine import bundle as bundles
from dflash_trt.engine.backend import BundleBackend
from dflash_trt.engine.config import BACKENDS
from dflash_trt.errors import ConfigError
from dflash_trt.model.loader import LoadedPair
from dflash_trt.runtime.runner import DraftRunner, TargetRunner
from dflash_trt.runtime.scheduler import ServiceLimits


def pair_runners(pair: LoadedPair, limits: ServiceLimits) -> tuple[TargetRunner, DraftRunner | None]:
    """Target / draft runners for a loaded pair on its device (no drafter when the block size is 1)."""
    block_size = limits.block_size or (pair.draft.config.block_size if pair.draft is not None else 1)
    if block_size > 1 and pair.draft is None:
        raise ValueError("block_size > 1 needs a drafter")
    if pair.target.lm_head.weight.device.type == "cpu":
        from dflash_trt.backends.cpu.runners import CpuDraftRunner as DraftClass
        from dflash_trt.backends.cpu.runners import CpuTargetRunner as TargetClass
    else:
        from dflash_trt.backends.torch.runners import TorchDraftRunner as DraftClass
        from dflash_trt.backends.torch.runners import TorchTargetRunner as TargetClass
    from dflash_trt.kernels import select

    kernels = select(pair.target.lm_head.weight.device)
    capacity = limits.max_seq_len + block_size + 1
    taps = pair.draft.config.target_layer_ids if block_size > 1 else ()
    graphs = {"graphs": limits.cuda_graphs} if pair.target.lm_head.weight.device.type == "cuda" else {}
    target = TargetClass(pair.target, limits.max_batch_size, capacity, taps, kernels, **graphs)
    draft = DraftClass(pair.draft, pair.target, limits.max_batch_size, capacity, block_size, limits.draft_confidence,
                       kernels, **graphs) if block_size > 1 else None
    return target, draft


def bundle_backend(name: str) -> BundleBackend:
    """The backend that fills bundles for the config value `backend: name`."""
    if name == "torch":
        from dflash_trt.backends.torch.bundle import TorchBackend

        return TorchBackend()
    if name == "trtllm":
        from dflash_trt.backends.trtllm.build import TrtllmBackend

        return TrtllmBackend()
    raise ConfigError(f"field 'backend': {name!r} is not one of {', '.join(BACKENDS)}")


@dataclass
class BundleRunners:
    """A bundle opened for serving: runners for the scheduler plus what requests are checked against."""

    target: TargetRunner
    draft: DraftRunner | None  # None when limits.block_size is 1 (autoregressive)
    tokenizer: object | None  # a `tokenizers`-backed tokenizer, or None (token ids only)
    vocab_size: int
    eos_ids: frozenset[int]
    detokenize: Callable[[list[int]], str] | None

    def shutdown(self) -> None:
        """Release what the runners hold outside this process's memory (an engine executor)."""
        if hasattr(self.target, "shutdown"):
            self.target.shutdown()


def open_runners(bundle: str | Path, limits: ServiceLimits, device: str | None = None,
                 manifest: dict | None = None) -> BundleRunners:
    """The runners of a built bundle, whatever its backend (the manifest says which; a folder being built
    passes the manifest it will get)."""
    manifest = manifest if manifest is not None else bundles.read_manifest(Path(bundle))
    backend = manifest.get("backend", "torch")
    if backend == "torch":
        return _torch_runners(bundle, manifest, limits, device)
    if backend == "trtllm":
        return _trtllm_runners(bundle, limits)
    raise ConfigError(f"{Path(bundle) / 'manifest.json'}: field 'backend': {backend!r} is not one of "
                      f"{', '.join(BACKENDS)}")


def _torch_runners(bundle, manifest: dict, limits: ServiceLimits, device: str | None) -> BundleRunners:
    from dflash_trt.backends.torch.bundle import HF_FORMAT, load_staged

    config = manifest["config"]
    pair = load_staged(Path(bundle), manifest.get("format", HF_FORMAT), config["dtype"],
                       device or config["runtime"]["device"], config["runtime"].get("draft_vocab_size"))
    target, draft = pair_runners(pair, limits)
    detokenize = pair.detokenize if pair.tokenizer is not None else None
    return BundleRunners(target, draft, pair.tokenizer, pair.target.config.vocab_size,
                         eos_ids(pair.target.config.eos_token_ids, pair.tokenizer), detokenize)


def _trtllm_runners(bundle, limits: ServiceLimits) -> BundleRunners:
    """TensorRT-LLM target + TensorRT draft runners (docs/trtllm-backend.md)."""
    from dflash_trt.backends.trtllm.runner import load_trtllm_runners
    from dflash_trt.tokenizer import has_tokenizer, load_tokenizer

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
