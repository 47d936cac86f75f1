"""Tables for benchmark results (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_local(results) -> None:
    table = Table(title="DFlash vs autoregressive (local torch runtime, batch 1, same prompts, one run)")
    for column in ("block", "prompts", "tokens", "τ", "DFlash tok/s", "AR tok/s", "speed-up", "identical",
                   "acceptance by draft position"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(str(r.block_size), str(r.prompts), str(r.generated_tokens), f"{r.mean_acceptance_length:.2f}",
                      f"{r.spec_tokens_per_s:.1f}", f"{r.ar_tokens_per_s:.1f}", f"{r.speedup:.2f}x",
                      "yes" if r.identical else "NO",
                      " ".join(f"{p:.2f}" for p in r.per_position_acceptance[:8]) + (" …" if r.block_size > 9 else ""))
    Console().print(table)
