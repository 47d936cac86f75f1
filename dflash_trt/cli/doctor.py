"""`dflash-trt doctor`: what this machine has for the GPU routes, found or missing (thin command)."""

from __future__ import annotations

import json

import click

COLORS = {"ok": "green", "missing": "red", "warn": "yellow"}


@click.command("doctor", short_help="Check GPU, CUDA, TensorRT, TensorRT-LLM, tritonserver, nvcc, modelopt.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows as one JSON object.")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, exists=True),
              help="A backend-trtllm build config: also print the GPU memory its engines' DFlash outputs reserve.")
def doctor_command(as_json, config_path):
    """Report each component as ok / missing / warn, with its version and what to install."""
    from dflash_trt.cli.machine import diagnose, reserved_for_config

    rows = diagnose()
    reserved = reserved_for_config(config_path) if config_path else None
    if as_json:
        click.echo(json.dumps({"components": rows, **({"reserved": reserved} if reserved else {})}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="dflash-trt doctor")
    for column in ("component", "status", "version", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for r in rows:
        table.add_row(r["component"], f"[{COLORS[r['status']]}]{r['status']}[/]", r["version"], r["detail"], r["fix"])
    Console(width=160).print(table)
    if reserved:
        click.echo(f"{config_path}: {reserved['summary']}")
