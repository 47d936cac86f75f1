"""`dflash-trt check-pair`: check a target + drafter pair before deploying it (engine/pair_check.py,
bench/check_pair.py)."""

from __future__ import annotations

import json

import click

from dflash_trt.cli.types import BUILTIN_DRAFT, BUILTIN_TARGET, MODEL_DIR

COLORS = {"ok": "green", "warn": "yellow", "fail": "red"}


@click.command("check-pair", short_help="Check a target + DFlash drafter pair before deploying it.")
@click.option("--target", type=MODEL_DIR, default=BUILTIN_TARGET, show_default=True, help="HF target folder.")
@click.option("--draft", type=MODEL_DIR, default=BUILTIN_DRAFT, show_default=True, help="DFlash drafter folder.")
@click.option("--prompts", "prompts_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL with text (or token_ids) per line for the measured checks (default: the shipped held-out set).")
@click.option("--num-prompts", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True)
@click.option("--use", type=click.Choice(["auto", "raw", "chat"]), default="auto", show_default=True,
              help="The prompt format requests will use: warned about when another one fits the drafter better.")
@click.option("--device", default="cpu", show_default=True)
@click.option("--static", "static_only", is_flag=True, help="Skip the measured checks (no forward pass).")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as one JSON object.")
def check_pair_command(target, draft, prompts_path, num_prompts, max_new_tokens, use, device, static_only, as_json):
    """Shapes, vocabulary, mask token, taps and their index convention, stop tokens, the chat template /
    thinking mode, τ raw and chat-templated; the launch settings for TensorRT-LLM, vLLM and SGLang.
    Exits 1 on a hard mismatch."""
    from dflash_trt.bench.check_pair import measured_checks
    from dflash_trt.engine.pair_check import FAIL, static_checks, verdict

    checks, tau = static_checks(target, draft), {}
    if not static_only and verdict(checks) != FAIL:
        measured, tau = measured_checks(target, draft, prompts_path, num_prompts, max_new_tokens, device, use)
        checks += measured
    result = verdict(checks)
    if as_json:
        click.echo(json.dumps({"verdict": result, "checks": [c.__dict__ for c in checks], "tau": tau}, indent=2))
    else:
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=f"dflash-trt check-pair: {result}")
        for column in ("check", "status", "detail"):
            table.add_column(column, overflow="fold")
        for c in checks:
            table.add_row(escape(c.name), f"[{COLORS[c.status]}]{c.status}[/]", escape(c.detail))
        Console(width=160).print(table)
    if result == FAIL:
        raise SystemExit(1)
