"""The `dflash-trt` command line: one click group, one thin command per pipeline stage.

Each command parses options, calls one library function and prints. Heavy imports (torch,
transformers, tritonclient, tensorrt_llm) happen inside commands, so `--help` is instant and
works without any GPU stack. Every option can also come from a `DFLASH_TRT_*` variable.
"""

from __future__ import annotations

import json

import click

from dflash_trt import __version__
from dflash_trt.cli_types import INT_LIST


@click.group(context_settings={"auto_envvar_prefix": "DFLASH_TRT", "help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dflash-trt")
def cli():
    """Build, serve and benchmark DFlash speculative decoding (TensorRT-LLM + Triton)."""


def _sampling_options(f):
    options = [
        click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
                     help="0 = greedy."),
        click.option("--top-k", type=click.IntRange(min=0), default=0, show_default=True, help="0 = off."),
        click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0, show_default=True),
        click.option("--seed", type=click.IntRange(0, 2**64 - 1), default=0, show_default=True),
        click.option("--max-new-tokens", type=click.IntRange(min=1), default=64, show_default=True),
        click.option("--stop", "stop_strings", multiple=True, help="Stop string (repeatable)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


@cli.command("generate", short_help="Generate text locally with DFlash (torch runtime).")
@click.option("--target", "target_dir", type=click.Path(file_okay=False), required=True, help="HF target folder.")
@click.option("--draft", "draft_dir", type=click.Path(file_okay=False), required=True, help="z-lab DFlash drafter folder.")
@click.option("--prompt", help="Prompt text (tokenized with the target's tokenizer).")
@click.option("--prompt-ids", type=INT_LIST, help="Prompt as token ids instead of text.")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the tokenizer's chat template.")
@click.option("--block-size", type=click.IntRange(min=2), help="Tokens per draft block (default: the drafter's).")
@_sampling_options
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N.")
@click.option("--dtype", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True)
@click.option("--compare-ar", is_flag=True, help="Also decode autoregressively; check tokens match, print speed-up.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: ids, text, statistics.")
def generate_command(target_dir, draft_dir, prompt, prompt_ids, chat, block_size, temperature, top_k, top_p,
                     seed, max_new_tokens, stop_strings, device, dtype, compare_ar, as_json):
    """Decode one prompt with a target + DFlash drafter pair and print text and statistics."""
    from dflash_trt import report
    from dflash_trt.runtime.local import generate, load_pair

    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("give exactly one of --prompt or --prompt-ids")
    pair = load_pair(target_dir, draft_dir, dtype, device)
    request = report.build_request(pair, prompt, prompt_ids, chat, temperature, top_k, top_p, seed,
                                   max_new_tokens, stop_strings)
    stream = None if as_json or pair.tokenizer is None else report.TextStreamer(pair)
    results, stats = generate(pair, [request], block_size, on_commit=stream)
    baseline = generate(pair, [request], autoregressive=True) if compare_ar else None
    if as_json:
        click.echo(json.dumps(report.generation_json(request, results[0], stats, baseline)))
    else:
        report.print_generation(pair, results[0], stats, baseline, streamed=stream is not None)


# Commands that live in their own modules (each module defines one click command object).
# Registered by name so that `dflash-trt --help` imports no heavy dependency.
# Maps module -> attribute, e.g. {"dflash_trt.convert_cli": "convert_command"}.
_COMMAND_MODULES: dict[str, str] = {
    "dflash_trt.train_cli": "train_draft_command",
    "dflash_trt.convert_cli": "convert_command",
}


def _register_command_modules() -> None:
    import importlib

    for module_name, attribute in _COMMAND_MODULES.items():
        cli.add_command(getattr(importlib.import_module(module_name), attribute))


_register_command_modules()


def main():
    cli()


if __name__ == "__main__":
    main()
