"""The `dflash-trt` command line: one click group, one thin command per pipeline stage.

Each command parses options, calls one library function and prints. Heavy imports (torch,
transformers, tritonclient, tensorrt_llm) happen inside commands, so `--help` is instant and
works without any GPU stack. Every option can also come from a `DFLASH_TRT_*` variable.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from dflash_trt import __version__
from dflash_trt.cli_types import DRAFT_VOCAB, DRAFT_VOCAB_HELP, INT_LIST


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


BUILTIN_TARGET = "builtin:tiny-qwen3"
BUILTIN_DRAFT = "builtin:tiny-qwen3-dflash"


def _model_dir(value: str) -> str:
    from dflash_trt.engine.config import resolve_model_path

    return str(resolve_model_path(value, Path.cwd()))


@cli.command("generate", short_help="Generate text with DFlash: locally (torch) or from a server (--url).")
@click.option("--target", "target_dir", default=BUILTIN_TARGET, show_default=True, help="HF target folder.")
@click.option("--draft", "draft_dir", default=BUILTIN_DRAFT, show_default=True, help="z-lab DFlash drafter folder.")
@click.option("--url", help="Query a served model instead (gRPC host:port, or HTTP host:port with --protocol http).")
@click.option("--protocol", type=click.Choice(["grpc", "http"]), default="grpc", show_default=True)
@click.option("--prompt", help="Prompt text (tokenized with the target's tokenizer).")
@click.option("--prompt-ids", type=INT_LIST, help="Prompt as token ids instead of text.")
@click.option("--chat", is_flag=True, help="Wrap the prompt in the tokenizer's chat template.")
@click.option("--block-size", type=click.IntRange(min=2), help="Tokens per draft block (default: the drafter's).")
@click.option("--draft-vocab", type=DRAFT_VOCAB, default="auto", show_default=True, help=DRAFT_VOCAB_HELP)
@click.option("--draft-confidence", type=click.FloatRange(min=0, max=1, max_open=True),
              help="Verify only the drafts whose running draft probability is >= this (0 = full blocks). "
                   "Default: 0.1 on CPU, 0 on GPUs.")
@_sampling_options
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N.")
@click.option("--dtype", type=click.Choice(["auto", "fp32", "bf16", "fp16"]), default="auto", show_default=True)
@click.option("--compare-ar", is_flag=True, help="Also decode autoregressively; check tokens match, print speed-up.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: ids, text, statistics.")
def generate_command(target_dir, draft_dir, url, protocol, prompt, prompt_ids, chat, block_size, draft_vocab,
                     draft_confidence, temperature, top_k,
                     top_p, seed, max_new_tokens, stop_strings, device, dtype, compare_ar, as_json):
    """Decode one prompt with a target + DFlash drafter pair and print text and statistics."""
    from dflash_trt import report

    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("give exactly one of --prompt or --prompt-ids")
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    if url:
        report.remote_generate(url, protocol, prompt, prompt_ids, chat, sampling, max_new_tokens, stop_strings, as_json)
        return
    from dflash_trt.runtime.local import (
        apply_draft_vocab,
        default_draft_confidence,
        generate,
        load_pair,
    )

    pair = apply_draft_vocab(load_pair(_model_dir(target_dir), _model_dir(draft_dir), dtype, device), draft_vocab)
    request = report.build_request(pair, prompt, prompt_ids, chat, temperature, top_k, top_p, seed,
                                   max_new_tokens, stop_strings)
    stream = None if as_json or pair.tokenizer is None else report.TextStreamer(pair)
    if draft_confidence is None:
        draft_confidence = default_draft_confidence(pair.target.lm_head.weight.device)
    results, stats = generate(pair, [request], block_size, on_commit=stream, min_confidence=draft_confidence)
    baseline = generate(pair, [request], autoregressive=True) if compare_ar else None
    if as_json:
        click.echo(json.dumps(report.generation_json(request, results[0], stats, baseline)))
    else:
        report.print_generation(pair, results[0], stats, baseline, streamed=stream is not None)


@cli.command("build", short_help="Build an engine bundle from CONFIG.yaml (and publish it with --publish).")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--publish/--no-publish", default=True, show_default=True,
              help="Also render the Triton repository named by the config's `repository`.")
def build_command(config, publish):
    """convert -> build -> bundle (manifest, hashes, golden outputs) -> publish; atomic and reused when unchanged."""
    from dflash_trt.engine.build import build_bundle
    from dflash_trt.engine.config import load_build_config
    from dflash_trt.triton.repository import publish as publish_repo

    cfg = load_build_config(config)
    path, manifest, reused = build_bundle(cfg, log=lambda m: click.echo(m, err=True))
    golden = manifest["golden"]
    click.echo(f"bundle: {path} ({'reused' if reused else 'built'}, {manifest['size_bytes'] / 1e6:.1f} MB, "
               f"golden τ {golden['mean_acceptance_length']:.2f})")
    if publish:
        click.echo(f"repository: {publish_repo(path, cfg.repository_path())}")


@cli.command("publish", short_help="Render a Triton model repository for a bundle.")
@click.argument("bundle", type=click.Path(exists=True, file_okay=False))
@click.argument("repository", type=click.Path(file_okay=False))
@click.option("--device", help="Override the bundle's runtime device (cpu, cuda, cuda:N).")
@click.option("--max-batch-size", type=click.IntRange(min=1), help="Override the bundle's slot count.")
def publish_command(bundle, repository, device, max_batch_size):
    """Verify the bundle's hashes, then (re)write REPOSITORY/dflash atomically."""
    from dflash_trt.triton.repository import publish

    click.echo(f"repository: {publish(bundle, repository, device=device, max_batch_size=max_batch_size)}")


@cli.command("serve", short_help="Run tritonserver on a repository until Ctrl-C.")
@click.argument("repository", type=click.Path(exists=True, file_okay=False))
@click.option("--host", default="127.0.0.1", show_default=True, help="Bind address (all three endpoints).")
@click.option("--http-port", type=int, default=8000, show_default=True)
@click.option("--grpc-port", type=int, default=8001, show_default=True)
@click.option("--metrics-port", type=int, default=8002, show_default=True)
@click.option("--log", "log_path", type=click.Path(dir_okay=False), help="Server log file (default: inherit).")
def serve_command(repository, host, http_port, grpc_port, metrics_port, log_path):
    """Start tritonserver (system install or the nvidia-pytriton binary), wait until ready, stop on Ctrl-C."""
    import signal
    import threading

    from dflash_trt.triton.server import Ports, TritonServer

    server = TritonServer(repository, host, Ports(http_port, grpc_port, metrics_port), log_path)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    with server:
        click.echo(f"ready: grpc {server.grpc_url}  http {server.url}  metrics {host}:{metrics_port}  (Ctrl-C stops)")
        try:
            while not stopped.wait(0.5) and server.process.poll() is None:
                pass
        except KeyboardInterrupt:
            pass
        click.echo("stopping tritonserver")


@cli.command("regress", short_help="Rebuild presets and compare with committed baselines.")
@click.argument("configs", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--baselines", type=click.Path(file_okay=False), default="build_configs/baselines", show_default=True)
@click.option("--update", is_flag=True, help="Rewrite the baselines from this build.")
def regress_command(configs, baselines, update):
    """Rebuild every preset this machine can build (default: build_configs/*.yaml); fail on any regression."""
    from dflash_trt.engine.regress import print_table, regress_one

    paths = [Path(c) for c in configs] or sorted(Path("build_configs").glob("*.yaml"))
    if not paths:
        raise click.UsageError("no configs given and none in build_configs/")
    outcomes = [regress_one(p, Path(baselines), update, log=lambda m: click.echo(m, err=True)) for p in paths]
    print_table(outcomes)
    failed = [o.name for o in outcomes if o.status == "fail"]
    if failed:
        raise click.ClickException(f"regression in {', '.join(failed)}")


# Commands that live in their own modules (each module defines one click command object).
# Registered by name so that `dflash-trt --help` imports no heavy dependency.
# (module, attribute) pairs, e.g. ("dflash_trt.convert_cli", "convert_command").
_COMMAND_MODULES: tuple[tuple[str, str], ...] = (
    ("dflash_trt.train_cli", "train_draft_command"),
    ("dflash_trt.train_cli", "draft_vocab_command"),
    ("dflash_trt.bench_cli", "bench_command"),
    ("dflash_trt.convert_cli", "convert_command"),
    ("dflash_trt.export_cli", "export_group"),
    ("dflash_trt.doctor_cli", "doctor_command"),
)


def _register_command_modules() -> None:
    import importlib

    for module_name, attribute in _COMMAND_MODULES:
        cli.add_command(getattr(importlib.import_module(module_name), attribute))


_register_command_modules()


def main():
    cli()


if __name__ == "__main__":
    main()
