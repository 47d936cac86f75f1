"""Typed field access on a parsed JSON object, with errors that name the file and field path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dflash_trt.errors import CheckpointError, ConfigError

_MISSING = object()


def load_json(path: Path) -> dict:
    """Parse a JSON object file; a missing or malformed file is a one-line `CheckpointError`."""
    if not path.is_file():
        raise CheckpointError(f"{path}: file not found")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object at the top level")
    return data


def jsonl_records(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed value) of each non-blank line of a JSONL file; a line that does not parse is a
    `ConfigError` naming the file and line."""
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{n}: not valid JSON ({exc.msg})") from None


class Fields:
    """Reads fields of one JSON object; every error names `path` and the dotted field."""

    def __init__(self, data: dict, path: Path, prefix: str = ""):
        self.data, self.path, self.prefix = data, path, prefix

    def error(self, key: str, problem: str) -> CheckpointError:
        return CheckpointError(f"{self.path}: field '{self.prefix}{key}': {problem}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, kind: type | tuple, default: Any = _MISSING) -> Any:
        value = self.data.get(key)
        if value is None:
            if default is _MISSING:
                raise self.error(key, "missing (required)")
            return default
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if bool in kinds and isinstance(value, bool):
            return value
        if isinstance(value, bool) or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.error(key, f"expected {names}, got {value!r}")
        return float(value) if float in kinds and int not in kinds else value

    def int(self, key: str, default: Any = _MISSING, minimum: int | None = None) -> int:
        value = self.get(key, int, default)
        if value is not None and minimum is not None and value < minimum:
            raise self.error(key, f"must be >= {minimum}, got {value}")
        return value

    def float(self, key: str, default: Any = _MISSING) -> float:
        value = self.get(key, (int, float), default)
        return None if value is None else float(value)

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        return self.get(key, bool, default)

    def str(self, key: str, default: Any = _MISSING) -> str:
        return self.get(key, str, default)

    def sub(self, key: str) -> "Fields":
        value = self.get(key, dict, {})
        return Fields(value, self.path, f"{self.prefix}{key}.")

    def int_list(self, key: str, default: Any = _MISSING) -> list[int] | None:
        value = self.get(key, list, default)
        if value is None:
            return None
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise self.error(key, f"expected a list of integers, got {value!r}")
        return list(value)
