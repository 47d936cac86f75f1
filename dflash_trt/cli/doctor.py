"""`dflash-trt doctor`: what this machine has for the GPU routes, found or missing (thin command)."""

from __future__ import annotations

import json

import click

COLORS = {"ok": "green", "missing": "red", "warn": "yellow"}


@click.command("doctor", short_help="Check GPU, CUDA, TensorRT, TensorRT-LLM, tritonserver, nvcc, modelopt.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON object.")
def doctor_command(as_json):
    """Report each component as ok / missing / warn, with its version and what to install."""
    from dflash_trt.trtllm.doctor import diagnose

    rows = diagnose()
    if as_json:
        click.echo(json.dumps({"components": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="dflash-trt doctor")
    for column in ("component", "status", "version", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r["component"], f"[{COLORS[r['status']]}]{r['status']}[/]", r["version"], r["detail"], r["fix"])
    Console(width=160).print(table)
