"""Safetensors weights of a Hugging Face folder: one file or a sharded index. Never pickle."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from dflash_trt.checkpoint.json_fields import load_json
from dflash_trt.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class WeightFiles:
    """Tensor name -> shard file, with shapes read from headers (nothing loaded until `load`)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self.files = self._map_files()
        self.shapes: dict[str, tuple[int, ...]] = {}
        for file in sorted(set(self.files.values())):
            self._read_header(file)
        missing = sorted(name for name, file in self.files.items() if name not in self.shapes)
        if missing:
            raise CheckpointError(
                f"{self.folder / INDEX_FILE}: lists tensors absent from their shard: {_few(missing)}"
            )

    def _map_files(self) -> dict[str, Path]:
        index = self.folder / INDEX_FILE
        if index.is_file():
            weight_map = load_json(index).get("weight_map")
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: field 'weight_map': missing or empty")
            return {name: self.folder / file for name, file in weight_map.items()}
        single = self.folder / SINGLE_FILE
        if not single.is_file():
            raise CheckpointError(f"{self.folder}: no {SINGLE_FILE} or {INDEX_FILE} found")
        return {name: single for name in self._header_names(single)}

    @staticmethod
    def _header_names(file: Path) -> list[str]:
        try:
            with safe_open(str(file), framework="pt") as f:
                return list(f.keys())
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{file}: unreadable safetensors file ({exc})") from None

    def _read_header(self, file: Path) -> None:
        if not file.is_file():
            raise CheckpointError(f"{file}: shard listed in {INDEX_FILE} not found")
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    self.shapes[name] = tuple(f.get_slice(name).get_shape())
        except (SafetensorError, OSError, ValueError) as exc:
            raise CheckpointError(f"{file}: unreadable safetensors file ({exc})") from None

    def names(self) -> set[str]:
        return set(self.files)

    def load(self, names: list[str], dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Load the named tensors, cast to `dtype`, grouped by shard so each file opens once."""
        by_file: dict[Path, list[str]] = {}
        for name in names:
            by_file.setdefault(self.files[name], []).append(name)
        out = {}
        for file, group in by_file.items():
            try:
                with safe_open(str(file), framework="pt") as f:
                    for name in group:
                        out[name] = f.get_tensor(name).to(dtype)
            except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
                raise CheckpointError(f"{file}: cannot read tensors ({exc})") from None
        return out


def check_tensors(
    weights: WeightFiles,
    expected: dict[str, tuple[int, ...]],
    optional: set[str] = frozenset(),
    ignored: set[str] = frozenset(),
) -> None:
    """Every expected tensor present with its shape; nothing unknown left over."""
    where = weights.folder
    missing = sorted(set(expected) - weights.names() - set(optional))
    if missing:
        raise CheckpointError(f"{where}: missing tensors: {_few(missing)}")
    for name, shape in expected.items():
        if name in weights.shapes and weights.shapes[name] != tuple(shape):
            raise CheckpointError(
                f"{where}: tensor '{name}' has shape {list(weights.shapes[name])}, "
                f"expected {list(shape)} from config.json"
            )
    unknown = sorted(weights.names() - set(expected) - set(ignored))
    if unknown:
        raise CheckpointError(f"{where}: unexpected tensors (not in this architecture): {_few(unknown)}")


def _few(names: list[str], limit: int = 5) -> str:
    more = f" (+{len(names) - limit} more)" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more
