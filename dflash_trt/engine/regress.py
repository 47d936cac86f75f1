"""Engine regression builds: rebuild each preset and compare it with a committed baseline.

A baseline (`build_configs/baselines/<name>.json`) holds the golden token ids for the fixed
prompts, the mean acceptance length τ and the bundle size. A rebuild regresses when any golden
token differs, when τ drops by more than `golden.tau_tolerance` (relative), or when the bundle
grows by more than `golden.size_tolerance`. Presets this machine cannot build (backend trtllm
without TensorRT-LLM / CUDA) are reported as skipped, with the reason.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from dflash_trt.engine.config import BuildConfig, load_build_config
from dflash_trt.errors import MissingDependencyError, UnsupportedModelError


@dataclass
class Outcome:
    name: str
    status: str  # pass | fail | skip | updated
    details: list[str]
    tau: float | None = None
    baseline_tau: float | None = None
    size: int | None = None


def baseline_of(manifest: dict) -> dict:
    golden = manifest["golden"]
    return {
        "name": manifest["name"],
        "block_size": golden["block_size"],
        "max_new_tokens": golden["max_new_tokens"],
        "golden_token_ids": [o["token_ids"] for o in golden["outputs"]],
        "mean_acceptance_length": golden["mean_acceptance_length"],
        "size_bytes": manifest["size_bytes"],
        "versions": manifest["versions"],
    }


def compare(cfg: BuildConfig, new: dict, old: dict) -> list[str]:
    """Human-readable regressions of `new` against `old` (empty = pass)."""
    problems = []
    for i, (a, b) in enumerate(zip(new["golden_token_ids"], old["golden_token_ids"])):
        if a != b:
            at = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            problems.append(f"golden prompt {i}: tokens differ from position {at}")
    if len(new["golden_token_ids"]) != len(old["golden_token_ids"]):
        problems.append(f"golden prompt count {len(new['golden_token_ids'])} != {len(old['golden_token_ids'])}")
    floor = old["mean_acceptance_length"] * (1 - cfg.golden.tau_tolerance)
    if new["mean_acceptance_length"] < floor:
        problems.append(f"τ {new['mean_acceptance_length']:.3f} < {floor:.3f} "
                        f"(baseline {old['mean_acceptance_length']:.3f} - {cfg.golden.tau_tolerance:.0%})")
    ceiling = old["size_bytes"] * (1 + cfg.golden.size_tolerance)
    if new["size_bytes"] > ceiling:
        problems.append(f"bundle {new['size_bytes']} bytes > {ceiling:.0f} (baseline +{cfg.golden.size_tolerance:.0%})")
    return problems


def can_build(cfg: BuildConfig) -> str | None:
    """None if this machine can build the preset, else why not."""
    if cfg.backend == "trtllm":
        try:
            import tensorrt_llm  # noqa: F401
        except ImportError:
            return "backend trtllm: tensorrt_llm not installed (GPU CI builds this preset)"
    for kind, path in (("target", cfg.target_path()), ("draft", cfg.draft_path())):
        if not (path / "config.json").is_file():
            return f"{kind} {path} not downloaded"
    return None


def regress_one(config_path: Path, baselines: Path, update: bool, build, log=print) -> Outcome:
    """Rebuild one preset with `build(cfg, log) -> (path, manifest, reused)` (runtime.build.build) and
    compare it with its baseline."""
    cfg = load_build_config(config_path)
    reason = can_build(cfg)
    if reason:
        return Outcome(cfg.name, "skip", [reason])
    with tempfile.TemporaryDirectory(prefix="dflash-regress-") as tmp:
        fresh = replace(cfg, output=str(Path(tmp) / cfg.name))  # always a real rebuild, never a reuse
        try:
            _, manifest, _ = build(fresh, log=log)
        except (MissingDependencyError, UnsupportedModelError) as exc:
            return Outcome(cfg.name, "skip", [exc.format_message()])
    new = baseline_of(manifest)
    path = baselines / f"{cfg.name}.json"
    if update or not path.is_file():
        baselines.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(new, indent=1) + "\n")
        return Outcome(cfg.name, "updated", [f"wrote {path}"], new["mean_acceptance_length"], None, new["size_bytes"])
    old = json.loads(path.read_text())
    problems = compare(cfg, new, old)
    return Outcome(cfg.name, "fail" if problems else "pass", problems or ["golden tokens identical"],
                   new["mean_acceptance_length"], old["mean_acceptance_length"], new["size_bytes"])


def print_table(outcomes: list[Outcome]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="engine regression")
    for column in ("preset", "status", "τ", "baseline τ", "size MB", "details"):
        table.add_column(column)
    colors = {"pass": "green", "fail": "red", "skip": "yellow", "updated": "cyan"}
    for o in outcomes:
        table.add_row(o.name, f"[{colors[o.status]}]{o.status}[/]", _num(o.tau), _num(o.baseline_tau),
                      f"{o.size / 1e6:.2f}" if o.size else "-", "; ".join(o.details))
    console = Console(width=160)
    console.print(table)
    for o in outcomes:
        if o.status == "fail":
            for problem in o.details:
                console.print(f"{o.name}: {problem}", soft_wrap=True)


def _num(value: float | None) -> str:
    return f"{value:.3f}" if value is not None else "-"
