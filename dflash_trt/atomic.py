"""Atomic folder writes: build into a temporary sibling, rename into place only when complete.

An interrupted write leaves only a hidden `.NAME.tmp-PID-*` folder; the next write to the same place
removes temp folders whose process is gone. Used by bundles, drafter folders and repositories.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def _remove_stale_temps(out: Path) -> None:
    """Temp folders of builds that were killed (their pid is gone) are garbage; remove them."""
    for stale in out.parent.glob(f".{out.name}.tmp-*"):
        pid = stale.name.rsplit("-", 2)[-2] if stale.name.count("-") >= 2 else ""
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(stale, ignore_errors=True)


def write_atomically(out: Path, fill) -> Path:
    """Create a temp sibling of `out`, let `fill(tmp)` populate it, then swap it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temps(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-{os.getpid()}-", dir=out.parent))
    try:
        fill(tmp)
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
