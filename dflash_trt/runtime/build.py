"""`dflash-trt build` and `regress`: a config's bundle filled by its backend, goldens from the runtime."""

from __future__ import annotations

from pathlib import Path

from dflash_trt.engine.build import build_bundle
from dflash_trt.engine.config import BuildConfig
from dflash_trt.runtime.backends import bundle_backend
from dflash_trt.runtime.golden import bundle_golden


def build(cfg: BuildConfig, log=print) -> tuple[Path, dict, bool]:
    """Build (or reuse) the bundle for `cfg` with its backend; returns (path, manifest, reused)."""
    return build_bundle(cfg, bundle_backend(cfg.backend), lambda folder, info: bundle_golden(cfg, folder, info, log),
                        log)
