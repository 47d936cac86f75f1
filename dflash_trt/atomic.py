"""Atomic folder writes: build into a temporary folder, rename into place only when complete.

`write_atomically(out, fill, owned, scratch)`:
- refuses to replace an existing, non-empty `out` that `owned(out)` does not recognise as one this
  writer made (a bundle, a published model, a drafter folder): `output: .` must never delete the
  folder a config sits in. `check_replaceable` runs the same check before long work starts.
- `fill(tmp)` writes into `scratch/.NAME.tmp-PID-*` (default scratch: `out`'s parent; it must be on
  the same filesystem). A Triton repository keeps its scratch outside the repository folder, so
  nothing half-made ever sits where the server looks for models.
- the old `out` is moved to `scratch/.NAME.old-PID` and removed after the swap.
A killed write leaves only those two kinds of hidden folders; the next write of the same name removes
the ones whose process is gone, and puts back an old `out` a kill left only as `.old-*` (`remove_stale`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from dflash_trt.errors import ConfigError

Owned = Callable[[Path], bool]


def leftovers(folder: Path, name: str = "*") -> list[Path]:
    """Temp / old folders of atomic writes of `name` under `folder` (any process, alive or not)."""
    if not folder.is_dir():
        return []
    return sorted([*folder.glob(f".{name}.tmp-*"), *folder.glob(f".{name}.old-*")])


def _pid_of(leftover: Path) -> str:
    kind = ".tmp-" if ".tmp-" in leftover.name else ".old-"
    return leftover.name.rpartition(kind)[2].split("-")[0]


def remove_stale(folder: Path, name: str = "*", out: Path | None = None) -> list[Path]:
    """Remove the leftovers of writes whose process is gone; returns what was removed. A write killed
    between its two renames left the previous `out` only as `.NAME.old-*`: that one is put back."""
    removed = []
    for stale in leftovers(folder, name):
        pid = _pid_of(stale)
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        if out is not None and ".old-" in stale.name and not out.exists():
            os.replace(stale, out)
            continue
        shutil.rmtree(stale, ignore_errors=True)
        removed.append(stale)
    return removed


def repository_scratch(repository: Path) -> Path:
    """Where writes into a Triton model repository keep their temporaries: beside it, never inside
    (the server would take a half-written `.dflash.tmp-*` folder for a model)."""
    repository = Path(repository).resolve()
    return repository.parent / f".{repository.name}.dflash-trt-scratch"


def check_replaceable(out: Path, owned: Owned | None, what: str) -> None:
    """ConfigError unless `out` is absent, an empty folder, or (per `owned`) a `what` we wrote before."""
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir() or out.is_symlink():
        raise ConfigError(f"{out}: exists and is not a folder; the {what} needs a folder of its own there")
    if any(out.iterdir()) and not (owned is not None and owned(out)):
        raise ConfigError(f"{out}: a non-empty folder that is not a {what} this tool wrote; refusing to replace it "
                          "(pick another output folder, or empty or remove this one yourself)")


def write_atomically(out: Path, fill, owned: Owned | None = None, scratch: Path | None = None,
                     what: str = "folder") -> Path:
    """Let `fill(tmp)` populate a temp folder, then swap it into place at `out` (see the module doc)."""
    out = Path(out)
    scratch = Path(scratch) if scratch is not None else out.parent
    if scratch.is_dir():
        remove_stale(scratch, out.name, out)
    check_replaceable(out, owned, what)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=scratch))
    try:
        fill(tmp)
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-{os.getpid()}-", dir=scratch))
            os.replace(out, old)  # an empty dir as the target: rename over it
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
