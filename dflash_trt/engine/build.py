"""`dflash-trt build`: check inputs -> reuse or fill a bundle through its backend -> manifest.

`build_bundle(cfg, backend, log, golden)` is the same for every backend (the contract:
engine/backend.py): the pair is checked before any work, an unchanged bundle is reused, the backend
fills a temporary folder, `golden` decodes the golden prompts through it, a golden decode that differs
from autoregressive decoding fails the build, and the folder (manifest, hashes, golden outputs) moves
into place only when complete.
"""

from __future__ import annotations

import time
from pathlib import Path

from dflash_trt.atomic import check_replaceable, write_atomically
from dflash_trt.checkpoint.hf import check_pair, read_draft, read_target
from dflash_trt.engine import bundle as bundles
from dflash_trt.engine.backend import BundleBackend, Golden, Log
from dflash_trt.engine.config import BuildConfig
from dflash_trt.errors import ConfigError
from dflash_trt.model import draft_vocab


def build_bundle(cfg: BuildConfig, backend: BundleBackend, golden: Golden, log: Log = print) -> tuple[Path, dict, bool]:
    """Build (or reuse) the bundle for `cfg` with `backend`; returns (path, manifest, reused)."""
    if backend.name != cfg.backend:
        raise ConfigError(f"{cfg.source}: field 'backend': {cfg.backend!r}, but the {backend.name!r} backend was given")
    t0 = time.perf_counter()
    check_replaceable(cfg.output_path(), bundles.is_bundle, f"bundle ({cfg.source}: field 'output')")
    target_ckpt, draft_ckpt = read_target(cfg.target_path()), read_draft(cfg.draft_path())
    check_pair(target_ckpt, draft_ckpt)
    from dflash_trt.engine.pair_check import WARN, static_checks

    for check in static_checks(cfg.target_path(), cfg.draft_path()):  # `dflash-trt check-pair`'s static part
        if check.status == WARN:
            log(f"warning: check-pair: {check.name}: {check.detail} (dflash-trt check-pair measures it)")
    draft_vocab.token_ids(cfg.draft_path(), cfg.runtime.draft_vocab_size, target_ckpt.config.vocab_size,
                          f"{cfg.source}: field 'runtime.draft_vocab_size'")
    fingerprint = bundles.input_fingerprint(cfg)
    existing = bundles.reusable(cfg, fingerprint)
    if existing is not None:
        log(f"unchanged config and inputs: reusing {existing}")
        return existing, bundles.read_manifest(existing), True

    def fill(tmp: Path) -> None:
        filled = backend.fill(cfg, tmp, log)
        outputs = golden(tmp, filled.pair_info)
        if not outputs["matches_autoregressive"]:
            raise ConfigError(f"{cfg.source}: {backend.name} output differs from autoregressive output "
                              "(a bug: report it)")
        bundles.write_manifest(tmp, cfg, fingerprint, filled.pair_info, outputs, time.perf_counter() - t0,
                               filled.versions)

    out = write_atomically(cfg.output_path(), fill, owned=bundles.is_bundle,
                           what=f"bundle ({cfg.source}: field 'output')")
    return out, bundles.read_manifest(out), False
