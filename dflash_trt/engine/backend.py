"""The build contract every backend fills: `engine/build.py` owns the bundle, a backend its contents.

`build_bundle(cfg, backend, log)` checks the pair, decides whether an existing bundle can be reused,
hands `backend.fill(cfg, tmp, log)` an empty temporary folder, refuses a bundle whose golden decode
differs from autoregressive decoding, writes the manifest over what the backend left there and moves
the folder into place. A backend (torch: `engine/torch_backend.py`; trtllm: `trtllm/build.py`) only
fills the folder and describes what it wrote. Which backend serves which name is the runtime's
business (`runtime/backends.py`), so nothing in `engine/` imports a backend that imports it back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from dflash_trt.engine.config import BuildConfig

Log = Callable[[str], None]


@dataclass
class FilledBundle:
    """What a backend wrote into the bundle folder, for the manifest."""

    pair_info: dict  # block_size, mask_token_id, target_layer_ids, target, draft, has_tokenizer, format, ...
    golden: dict  # engine/golden.py `golden_block`: outputs, τ, matches_autoregressive
    versions: dict | None = None  # extra package versions the bundle only loads under (engines)


class BundleBackend(Protocol):
    name: str  # the config's `backend` value

    def fill(self, cfg: BuildConfig, tmp: Path, log: Log) -> FilledBundle:
        """Write the bundle's contents (target/, draft/, ...) into the empty folder `tmp`."""
        ...
