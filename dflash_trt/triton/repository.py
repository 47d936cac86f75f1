"""`dflash-trt publish BUNDLE REPO`: render a Triton model repository for a bundle, atomically.

The templates are the top-level `triton_model_repo/` (installed as `dflash_trt.triton_model_repo`):

    REPO/dflash/config.pbtxt      decoupled Python-backend model; tensors of triton/protocol.py;
                                  parameters: bundle_path (absolute), bundle_manifest_sha256, limits, device
    REPO/dflash/1/model.py        thin entry point (triton/python_model.py)
    REPO/dflash_ar/...            the same bundle decoded autoregressively (mode: autoregressive), the
                                  baseline `dflash-trt bench --url` measures side by side
    REPO/ensemble/...             TensorRT-LLM's Triton client names and [batch, ...] shapes, forwarded
                                  to dflash over BLS (triton/ensemble.py)

`render_config` fills a template's `${...}` fields (triton_model_repo/README.md lists them). Each
model is written in a scratch folder beside the repository (never inside it: Triton would take a
half-written folder for a model) and renamed into place, replacing only a model `publish` wrote.
Leftovers of killed publishes (in the scratch folder, or inside the repository from older versions)
are removed on the next publish.
"""

from __future__ import annotations

import hashlib
import importlib.util
import shutil
from pathlib import Path
from string import Template

from dflash_trt.atomic import remove_stale, repository_scratch, write_atomically
from dflash_trt.engine.bundle import verify_bundle

MODEL_NAME = "dflash"
AR_MODEL_NAME = "dflash_ar"
ENSEMBLE_MODEL_NAME = "ensemble"  # TensorRT-LLM's client names over `dflash` (triton/ensemble.py)
MODELS = (MODEL_NAME, AR_MODEL_NAME, ENSEMBLE_MODEL_NAME)


def template_root() -> Path:
    """The triton_model_repo/ folder: installed with the package, or beside it in a source checkout."""
    spec = importlib.util.find_spec("dflash_trt.triton_model_repo")  # finds it without importing it
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parents[2] / "triton_model_repo"


def template(name: str) -> Path:
    """The template folder of model `name` (config.pbtxt, 1/model.py)."""
    folder = template_root() / name
    if not (folder / "config.pbtxt").is_file():
        raise FileNotFoundError(f"{folder / 'config.pbtxt'}: the Triton model template is missing "
                                "(reinstall dflash-trt)")
    return folder


def render_config(bundle: Path, manifest: dict, name: str = MODEL_NAME, device: str | None = None,
                  max_batch_size: int | None = None, max_seq_len: int | None = None) -> str:
    """Model `name`'s config.pbtxt for `bundle`, its template's fields filled (comments dropped)."""
    runtime = manifest["config"]["runtime"]
    fields = {
        "bundle_path": str(bundle.resolve()),
        "bundle_manifest_sha256": hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest(),
        "max_batch_size": str(max_batch_size or runtime["max_batch_size"]),
        "max_seq_len": str(max_seq_len or runtime["max_seq_len"]),
        "device": device or runtime["device"],
        "block_size": str(manifest["block_size"]),
    }
    text = (template(name) / "config.pbtxt").read_text()
    body = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#"))
    header = f"# Rendered by `dflash-trt publish` from triton_model_repo/{name}/config.pbtxt.\n"
    return header + Template(body).substitute(fields)


def publish(bundle: str | Path, repository: str | Path, with_autoregressive: bool = True, **overrides) -> Path:
    """Verify the bundle, then (re)write REPO/dflash (and REPO/dflash_ar) atomically."""
    bundle, repository = Path(bundle).resolve(), Path(repository)
    manifest = verify_bundle(bundle)
    repository.mkdir(parents=True, exist_ok=True)
    for name in MODELS if with_autoregressive else (MODEL_NAME, ENSEMBLE_MODEL_NAME):
        config = render_config(bundle, manifest, name, **overrides)

        def fill(tmp: Path, config=config, source=template(name)) -> None:
            (tmp / "1").mkdir()
            (tmp / "config.pbtxt").write_text(config)
            shutil.copy(source / "1" / "model.py", tmp / "1" / "model.py")

        write_atomically(repository / name, fill, owned=is_published_model, scratch=repository_scratch(repository),
                         what="Triton model published by dflash-trt")
    remove_stale(repository)  # leftovers older versions of publish kept inside the repository
    return repository


def is_published_model(folder: Path) -> bool:
    """A model folder `publish` wrote (its config names the bundle's manifest hash): one it may replace."""
    try:
        return 'key: "bundle_manifest_sha256"' in (Path(folder) / "config.pbtxt").read_text()
    except (OSError, UnicodeDecodeError):
        return False
