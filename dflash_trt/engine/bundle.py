"""Engine bundles: a self-describing folder a server can load and a person can inspect.

    bundle/
      manifest.json       config, input hashes, package versions, backend, block size,
                          every file's sha256 and size, golden outputs for fixed prompts
      build_config.yaml   the resolved build config
      target/ draft/      what the backend loads (torch backend: HF folders; tokenizer in target/)

Builds write into a temporary sibling folder and rename into place only when complete, so an
interrupted build leaves nothing half-made. `load_bundle` re-hashes every file and refuses a
bundle whose bytes changed.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import time
from pathlib import Path

from dflash_trt import __version__
from dflash_trt.atomic import write_atomically  # noqa: F401 (re-exported: publish, exports)
from dflash_trt.engine.config import BuildConfig, dump_build_config
from dflash_trt.errors import CheckpointError
from dflash_trt.model.draft_vocab import VOCAB_FILE

FORMAT_VERSION = 1
MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
               "chat_template.jinja", "model.safetensors.index.json", VOCAB_FILE)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def model_files(folder: Path) -> list[Path]:
    """The files of a model folder a bundle needs: configs, tokenizer, safetensors."""
    names = set(MODEL_FILES)
    return sorted(p for p in folder.iterdir() if p.is_file() and (p.name in names or p.suffix == ".safetensors"))


def hash_folder(folder: Path) -> dict[str, str]:
    return {p.name: sha256_file(p) for p in model_files(folder)}


def package_versions() -> dict[str, str]:
    import torch
    import transformers

    return {"dflash_trt": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def input_fingerprint(cfg: BuildConfig) -> dict:
    """What a bundle was built from: the config digest and the inputs' file hashes."""
    return {"config_sha256": cfg.digest(), "target": hash_folder(cfg.target_path()),
            "draft": hash_folder(cfg.draft_path()), "dflash_trt": __version__}


def file_table(root: Path) -> dict[str, dict]:
    table = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != "manifest.json":
            table[str(path.relative_to(root))] = {"sha256": sha256_file(path), "bytes": path.stat().st_size}
    return table


def read_manifest(bundle: Path) -> dict:
    path = Path(bundle) / "manifest.json"
    if not path.is_file():
        raise CheckpointError(f"{bundle}: not a bundle (no manifest.json); run `dflash-trt build CONFIG.yaml`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None


def verify_bundle(bundle: Path, manifest: dict | None = None) -> dict:
    """Re-hash every file listed in the manifest; a changed, missing or extra file is an error."""
    bundle = Path(bundle)
    manifest = manifest or read_manifest(bundle)
    for rel, entry in manifest.get("files", {}).items():
        path = bundle / rel
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in manifest.json but missing; rebuild the bundle")
        if path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            raise CheckpointError(
                f"{path}: sha256 differs from manifest.json (file corrupted or edited); rebuild the bundle"
            )
    return manifest


def reusable(cfg: BuildConfig, fingerprint: dict) -> Path | None:
    """The existing bundle at the output path, if built from the same config and inputs."""
    out = cfg.output_path()
    if not (out / "manifest.json").is_file():
        return None
    try:
        manifest = verify_bundle(out)
    except CheckpointError:
        return None
    return out if manifest.get("fingerprint") == fingerprint else None


def copy_model(src: Path, dst: Path) -> None:
    dst.mkdir(parents=True)
    for path in model_files(src):
        shutil.copy2(path, dst / path.name)


def write_manifest(root: Path, cfg: BuildConfig, fingerprint: dict, pair_info: dict, golden: dict,
                   build_seconds: float, extra_versions: dict | None = None) -> dict:
    (root / "build_config.yaml").write_text(dump_build_config(cfg))
    manifest = {
        "format_version": FORMAT_VERSION,
        "name": cfg.name,
        "backend": cfg.backend,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": round(build_seconds, 2),
        "config": cfg.to_dict(),
        "fingerprint": fingerprint,
        "versions": package_versions() | (extra_versions or {}),
        **pair_info,
        "golden": golden,
        "files": file_table(root),
    }
    manifest["size_bytes"] = sum(f["bytes"] for f in manifest["files"].values())
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
