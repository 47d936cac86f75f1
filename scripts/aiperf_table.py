"""Summarize scripts/bench_aiperf.sh's runs: aiperf's profile_export_aiperf.json per model and concurrency
-> one table with DFlash's speed-up per column (rich) and OUT/summary.json: DFlash / AR for throughput,
AR / DFlash for latencies (above 1: DFlash is better).

    python scripts/aiperf_table.py OUT CONCURRENCY...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

METRICS = [  # (aiperf metric, statistic, column, higher is better)
    ("output_token_throughput", "avg", "output tok/s", True),
    ("request_latency", "p50", "latency p50 ms", False),
    ("request_latency", "p99", "latency p99 ms", False),
    ("time_to_first_token", "p50", "TTFT p50 ms", False),
    ("inter_token_latency", "avg", "ITL ms", False),
]


def load(out: Path, model: str, concurrency: int) -> dict:
    path = out / f"{model}-c{concurrency}" / "profile_export_aiperf.json"
    data = json.loads(path.read_text())
    if data.get("error_summary"):
        raise SystemExit(f"{path}: aiperf reports errors: {data['error_summary']}")
    return {column: data[metric][stat] for metric, stat, column, _ in METRICS}


def main(argv: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    out, levels = Path(argv[0]), [int(c) for c in argv[1:]]
    summary, table = [], Table(title="aiperf -> dflash-trt serve --openai-port (/v1/completions, streaming)")
    for column in ("concurrency", "model", *(c for _, _, c, _ in METRICS)):
        table.add_column(column, justify="right")
    for c in levels:
        rows = {m: load(out, m, c) for m in ("dflash", "dflash_ar")}
        for model, row in rows.items():
            table.add_row(str(c), model, *(f"{row[col]:.1f}" for _, _, col, _ in METRICS))
            summary.append({"concurrency": c, "model": model, **row})
        ratio = {col: rows["dflash"][col] / rows["dflash_ar"][col] if higher else rows["dflash_ar"][col] / rows["dflash"][col]
                 for _, _, col, higher in METRICS}
        table.add_row(str(c), "DFlash speed-up", *(f"{ratio[col]:.2f}x" for _, _, col, _ in METRICS), style="bold")
        summary.append({"concurrency": c, "model": "ratio", **ratio})
    Console().print(table)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'summary.json'}")


if __name__ == "__main__":
    main(sys.argv[1:])
