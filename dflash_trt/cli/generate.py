"""`dflash-trt generate`: decode one prompt locally (the engine, in process) or from a served model (--url)."""

from __future__ import annotations

import json
from dataclasses import replace

import click

from dflash_trt.cli.types import BUILTIN_DRAFT, BUILTIN_TARGET, DRAFT_VOCAB, DRAFT_VOCAB_HELP, INT_LIST, MODEL_DIR


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


@click.command("generate", short_help="Generate text with DFlash: locally (in process) or from a server (--url).")
@click.option("--target", "target_dir", type=MODEL_DIR, default=BUILTIN_TARGET, show_default=True,
              help="HF target folder.")
@click.option("--draft", "draft_dir", type=MODEL_DIR, default=BUILTIN_DRAFT, show_default=True,
              help="z-lab DFlash drafter folder.")
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
@click.option("--compare-ar", is_flag=True, help="Also decode autoregressively; check tokens match, print speed-up "
              "(both warmed up first on the same prompt, so neither pays one-time costs in the comparison).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: ids, text, statistics.")
def generate_command(target_dir, draft_dir, url, protocol, prompt, prompt_ids, chat, block_size, draft_vocab,
                     draft_confidence, temperature, top_k,
                     top_p, seed, max_new_tokens, stop_strings, device, dtype, compare_ar, as_json):
    """Decode one prompt with a target + DFlash drafter pair and print text and statistics."""
    from dflash_trt.cli import report

    if (prompt is None) == (prompt_ids is None):
        raise click.UsageError("give exactly one of --prompt or --prompt-ids")
    sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    if url:
        report.remote_generate(url, protocol, prompt, prompt_ids, chat, sampling, max_new_tokens, stop_strings, as_json)
        return
    from dflash_trt.decoding.requests import StopCriteria
    from dflash_trt.model.loader import apply_draft_vocab, load_pair
    from dflash_trt.runtime.local import default_draft_confidence, local_engine

    pair = apply_draft_vocab(load_pair(target_dir, draft_dir, dtype, device), draft_vocab)
    request = report.build_request(pair, prompt, prompt_ids, chat, temperature, top_k, top_p, seed,
                                   max_new_tokens, stop_strings)
    positions = pair.target.config.dims.max_position_embeddings
    if len(request.prompt) + max_new_tokens > positions:
        raise click.UsageError(f"--max-new-tokens {max_new_tokens}: the prompt ({len(request.prompt)} tokens) plus "
                               f"that exceeds the target's {positions} positions (max_position_embeddings); ask for "
                               f"at most {max(positions - len(request.prompt), 0)}")
    stream = None if as_json or pair.tokenizer is None else report.TextStreamer(pair)
    if draft_confidence is None:
        draft_confidence = default_draft_confidence(pair.target.lm_head.weight.device)
    length = len(request.prompt) + max_new_tokens
    engine = local_engine(pair, length, block_size, min_confidence=draft_confidence, max_batch_size=1)
    ar = local_engine(pair, length, autoregressive=True, max_batch_size=1) if compare_ar else None
    if compare_ar:  # a first pass builds caches and C++ plans: warm both, so the speed-up compares steady decoding
        warm = [replace(request, stop=StopCriteria(min(8, max_new_tokens)))]
        engine.generate(warm)
        ar.generate(warm)
    results, stats = engine.generate_with_stats([request], on_commit=stream)
    baseline = ar.generate_with_stats([request]) if compare_ar else None
    if as_json:
        click.echo(json.dumps(report.generation_json(request, results[0], stats, baseline)))
    else:
        report.print_generation(pair, results[0], stats, baseline, streamed=stream is not None)
