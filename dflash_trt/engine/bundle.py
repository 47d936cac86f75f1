"""Engine bundles: a self-describing folder a server can load and a person can inspect.

    bundle/
      manifest.json       config, input hashes, package versions, backend, block size,
                          every file's sha256 and size, golden outputs for fixed prompts
      build_config.yaml   the resolved build config
      target/ draft/      what the backend loads (torch backend: HF folders; tokenizer in target/)

Builds write into a temporary sibling folder and rename into place only when complete, so an
interrupted build leaves nothing half-made. `verify_bundle` refuses a bundle whose manifest was
edited (`manifest_sha256`: the digest of every other field), a listed file whose bytes changed or
is missing, and any file the manifest does not list. A bundle is data and nothing more: editing it
means rebuilding it.
"""

from __future__ import annotations

import hashlib
import json
import platform
import shutil
import time
from pathlib import Path

from dflash_trt import __version__
from dflash_trt.engine.config import BuildConfig, dump_build_config
from dflash_trt.errors import CheckpointError
from dflash_trt.model.draft_vocab import VOCAB_FILE

FORMAT_VERSION = 2  # 2: manifest_sha256, unlisted files refused
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
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


def file_table_paths(root: Path) -> list[str]:
    """Every file (and link) under a bundle but its manifest, relative to it."""
    return [str(p.relative_to(root)) for p in sorted(root.rglob("*"))
            if (p.is_file() or p.is_symlink()) and p.relative_to(root) != Path("manifest.json")]


def file_table(root: Path) -> dict[str, dict]:
    return {rel: {"sha256": sha256_file(root / rel), "bytes": (root / rel).stat().st_size}
            for rel in file_table_paths(root)}


def read_manifest(bundle: Path) -> dict:
    path = Path(bundle) / "manifest.json"
    if not path.is_file():
        raise CheckpointError(f"{bundle}: not a bundle (no manifest.json); run `dflash-trt build CONFIG.yaml`")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None


def manifest_digest(manifest: dict) -> str:
    """sha256 of the manifest's fields other than `manifest_sha256` (canonical JSON)."""
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def verify_bundle(bundle: Path, manifest: dict | None = None) -> dict:
    """Check the manifest's own digest, re-hash every file it lists and refuse files it does not list."""
    bundle = Path(bundle)
    manifest = manifest or read_manifest(bundle)
    where = bundle / "manifest.json"
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{where}: field 'format_version': {manifest.get('format_version')!r} is not "
                              f"{FORMAT_VERSION}; rebuild the bundle with this dflash-trt")
    if manifest.get("manifest_sha256") != manifest_digest(manifest):
        raise CheckpointError(f"{where}: edited after the build (its fields no longer match manifest_sha256); "
                              "rebuild the bundle instead of editing it")
    listed = manifest.get("files", {})
    extra = sorted(rel for rel in file_table_paths(bundle) if rel not in listed)
    if extra:
        raise CheckpointError(f"{bundle / extra[0]}: not listed in manifest.json ({len(extra)} unlisted file(s)); "
                              "a bundle is loaded only as built: rebuild it")
    for rel, entry in listed.items():
        path = bundle / rel
        if not path.is_file():
            raise CheckpointError(f"{path}: listed in manifest.json but missing; rebuild the bundle")
        if path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
            raise CheckpointError(
                f"{path}: sha256 differs from manifest.json (file corrupted or edited); rebuild the bundle"
            )
    return manifest


def verify_published(bundle: Path, manifest_sha256: str | None) -> dict:
    """`verify_bundle`, and the manifest must be the one a repository was published from (the
    `bundle_manifest_sha256` its config.pbtxt records): a rebuilt or edited bundle means re-publish."""
    path = Path(bundle) / "manifest.json"
    try:
        raw = path.read_bytes()
    except OSError:
        raise CheckpointError(f"{bundle}: not a bundle (no manifest.json); run `dflash-trt build CONFIG.yaml`") from None
    if hashlib.sha256(raw).hexdigest() != manifest_sha256:
        raise CheckpointError(f"{path}: not the manifest this model was published from (config.pbtxt "
                              "bundle_manifest_sha256 differs); run `dflash-trt publish` again")
    try:
        manifest = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    return verify_bundle(bundle, manifest)


def is_bundle(folder: Path) -> bool:
    """A folder `build` wrote (a manifest with a format version): one a rebuild may replace."""
    try:
        return "format_version" in json.loads((Path(folder) / "manifest.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


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
    manifest["manifest_sha256"] = manifest_digest(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
