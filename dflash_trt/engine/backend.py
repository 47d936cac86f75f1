"""The build contract every backend fills: `engine/build.py` owns the bundle, a backend its contents.

`build_bundle(cfg, backend, log, golden)` checks the pair, decides whether an existing bundle can be
reused, hands `backend.fill(cfg, tmp, log)` an empty temporary folder, has `golden` decode the golden
prompts through the filled folder's runners (the runtime's engine, as a server would), refuses a bundle
whose golden decode differs from autoregressive decoding, writes the manifest over what the backend left
there and moves the folder into place. A backend (torch: backends/torch/bundle.py; trtllm:
backends/trtllm/build.py) only fills the folder and describes what it wrote. Which backend serves which
name is the runtime's business (runtime/backends.py): nothing in `engine/` imports a backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from dflash_trt.engine.config import BuildConfig

Log = Callable[[str], None]
Golden = Callable[[Path, dict], dict]  # (filled folder, pair_info) -> the manifest's `golden` block


@dataclass
class FilledBundle:
    """What a backend wrote into the bundle folder, for the manifest."""

    pair_info: dict  # block_size, mask_token_id, target_layer_ids, target, draft, has_tokenizer, format, ...
    versions: dict | None = None  # extra package versions the bundle only loads under (engines)


class BundleBackend(Protocol):
    name: str  # the config's `backend` value

    def fill(self, cfg: BuildConfig, tmp: Path, log: Log) -> FilledBundle:
        """Write the bundle's contents (target/, draft/, ...) into the empty folder `tmp`."""
        ...
