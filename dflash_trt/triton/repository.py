"""`dflash-trt publish BUNDLE REPO`: render a Triton model repository for a bundle, atomically.

    REPO/dflash/config.pbtxt      decoupled Python-backend model; inputs/outputs of triton/protocol.py;
                                  parameters: bundle_path (absolute), bundle_sha256, limits, device
    REPO/dflash/1/model.py        thin entry point (model_template/model.py)
    REPO/dflash_ar/...            the same bundle decoded autoregressively (mode: autoregressive), the
                                  baseline `dflash-trt bench --url` measures side by side

The repository is written to a temporary sibling and renamed into place, replacing an older one.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from dflash_trt.engine.bundle import verify_bundle, write_atomically
from dflash_trt.triton.protocol import INPUTS, OUTPUTS

MODEL_NAME = "dflash"
AR_MODEL_NAME = "dflash_ar"
TEMPLATE = Path(__file__).parent / "model_template" / "model.py"


def _tensor_block(kind: str, specs, optional: bool) -> str:
    entries = []
    for name, dtype, dims in specs:
        extra = "\n    optional: true" if optional else ""
        entries.append(f'  {{\n    name: "{name}"\n    data_type: {dtype}\n    dims: {dims}{extra}\n  }}')
    return f"{kind} [\n" + ",\n".join(entries) + "\n]\n"


def render_config(bundle: Path, manifest: dict, device: str | None = None, max_batch_size: int | None = None,
                  max_seq_len: int | None = None, name: str = MODEL_NAME, mode: str = "dflash") -> str:
    runtime = manifest["config"]["runtime"]
    digest = hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()
    params = {
        "bundle_path": str(bundle.resolve()),
        "bundle_manifest_sha256": digest,
        "max_batch_size": str(max_batch_size or runtime["max_batch_size"]),
        "max_seq_len": str(max_seq_len or runtime["max_seq_len"]),
        "device": device or runtime["device"],
        "block_size": str(manifest["block_size"] if mode == "dflash" else 1),
        "mode": mode,
    }
    param_text = "\n".join(
        f'parameters {{\n  key: "{k}"\n  value: {{ string_value: "{v}" }}\n}}' for k, v in params.items()
    )
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        "model_transaction_policy { decoupled: true }\n"
        + _tensor_block("input", INPUTS, optional=True)
        + _tensor_block("output", OUTPUTS, optional=False)
        + "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
        + param_text + "\n"
    )


def publish(bundle: str | Path, repository: str | Path, with_autoregressive: bool = True, **overrides) -> Path:
    """Verify the bundle, then (re)write REPO/dflash (and REPO/dflash_ar) atomically."""
    bundle, repository = Path(bundle).resolve(), Path(repository)
    manifest = verify_bundle(bundle)
    repository.mkdir(parents=True, exist_ok=True)
    models = [(MODEL_NAME, "dflash")] + ([(AR_MODEL_NAME, "autoregressive")] if with_autoregressive else [])
    for name, mode in models:
        config = render_config(bundle, manifest, name=name, mode=mode, **overrides)

        def fill(tmp: Path, config=config) -> None:
            (tmp / "1").mkdir()
            (tmp / "config.pbtxt").write_text(config)
            shutil.copy(TEMPLATE, tmp / "1" / "model.py")

        write_atomically(repository / name, fill)
    return repository
