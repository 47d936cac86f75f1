"""What `dflash-trt generate` prints: requests from CLI options, streamed text, stats tables."""

from __future__ import annotations

import json
import sys

import click

from dflash_trt.decoding.requests import GenerationResult, Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.decoding.stats import DecodeStats
from dflash_trt.errors import RequestError
from dflash_trt.tokenizer import encode_prompt, stop_token_ids


def build_request(pair, prompt, prompt_ids, chat, temperature, top_k, top_p, seed, max_new_tokens, stop_strings):
    """A validated `Request` from CLI options (text is tokenized with the target's tokenizer)."""
    if prompt is not None:
        if pair.tokenizer is None:
            raise RequestError(f"{pair.target_dir}: no tokenizer.json; pass --prompt-ids instead of --prompt")
        if not prompt:
            raise RequestError("--prompt is empty")
        prompt_ids = encode_prompt(pair.tokenizer, prompt, chat)
    vocab = pair.target.config.vocab_size
    bad = [t for t in prompt_ids if not 0 <= t < vocab]
    if bad:
        raise RequestError(f"--prompt-ids: {bad[:5]} outside the vocabulary 0..{vocab - 1}")
    if stop_strings and pair.tokenizer is None:
        raise RequestError("--stop needs a tokenizer; this target folder has no tokenizer.json")
    try:
        return Request(
            tuple(prompt_ids),
            SamplingParams(temperature, top_k, top_p, seed),
            StopCriteria(max_new_tokens, stop_token_ids(pair.tokenizer, pair.target.config.eos_token_ids),
                         tuple(stop_strings)),
        )
    except ValueError as exc:
        raise RequestError(str(exc)) from None


class TextStreamer:
    """on_commit callback: prints newly committed text as it appears."""

    def __init__(self, pair):
        self.pair, self.tokens, self.printed = pair, [], 0

    def __call__(self, row: int, new: list[int]) -> None:
        self.tokens.extend(new)
        text = self.pair.detokenize(self.tokens)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            return
        sys.stdout.write(text[self.printed:])
        sys.stdout.flush()
        self.printed = len(text)


def _speedup(stats: DecodeStats, baseline) -> dict:
    if baseline is None:
        return {}
    ar_results, ar_stats = baseline
    return {"autoregressive": ar_stats.to_dict(), "speedup": _ratio(stats, ar_stats)}


def _ratio(stats: DecodeStats, ar_stats: DecodeStats) -> float:
    return stats.tokens_per_s / ar_stats.tokens_per_s if ar_stats.tokens_per_s else 0.0


def generation_json(request: Request, result: GenerationResult, stats: DecodeStats, baseline=None) -> dict:
    out = {
        "prompt_ids": list(request.prompt),
        "token_ids": result.tokens,
        "text": result.text,
        "finish_reason": result.finish_reason,
        "acceptance_lengths": result.acceptance_lengths,
        "stats": stats.to_dict(),
    }
    if baseline is not None:
        out |= _speedup(stats, baseline)
        out["matches_autoregressive"] = baseline[0][0].tokens == result.tokens
    return out


def print_generation(pair, result: GenerationResult, stats: DecodeStats, baseline, streamed: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    if streamed:
        click.echo()
    elif result.text is not None:
        click.echo(result.text)
    else:
        click.echo(f"token ids: {result.tokens}")
    table = Table(title="DFlash decoding", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("generated tokens", str(stats.generated_tokens))
    table.add_row("finish reason", result.finish_reason)
    table.add_row("verify steps", str(stats.verify_steps))
    table.add_row("mean acceptance length τ", f"{stats.mean_acceptance_length:.2f}")
    table.add_row("tokens/s", f"{stats.tokens_per_s:.1f}")
    if baseline is not None:
        ar_results, ar_stats = baseline
        table.add_row("autoregressive tokens/s", f"{ar_stats.tokens_per_s:.1f}")
        table.add_row("speed-up vs autoregressive", f"{_ratio(stats, ar_stats):.2f}x")
        table.add_row("identical to autoregressive", str(ar_results[0].tokens == result.tokens))
    rates = " ".join(f"{r:.2f}" for r in stats.per_position_acceptance)
    table.add_row("acceptance by draft position", rates or "-")
    Console(stderr=False).print(table)


def remote_generate(url, protocol, prompt, prompt_ids, chat, sampling, max_new_tokens, stop_strings, as_json):
    """`generate --url`: stream from a served `dflash` model and print text + statistics."""
    from dflash_trt.triton.client import grpc_generate, http_generate, request_inputs

    inputs = request_inputs(prompt, prompt_ids, max_new_tokens, stop_words=tuple(stop_strings), stream=True,
                            chat=chat, **sampling)
    call = grpc_generate if protocol == "grpc" else http_generate
    on_text = None if as_json else (lambda delta: (sys.stdout.write(delta), sys.stdout.flush()))
    result = call(url, inputs, on_text=on_text)
    if as_json:
        click.echo(json.dumps({"token_ids": result.token_ids, "text": result.text, "finish_reason": result.finish_reason,
                               "acceptance_lengths": result.acceptance_lengths,
                               "mean_acceptance_length": result.mean_acceptance_length,
                               "ttft_s": result.ttft_s, "total_s": result.total_s, "tokens_per_s": result.tokens_per_s}))
        return
    click.echo()
    click.echo(f"{len(result.token_ids)} tokens ({result.finish_reason}) in {result.total_s:.2f} s: "
               f"{result.tokens_per_s:.1f} tokens/s, TTFT {result.ttft_s * 1000:.0f} ms, "
               f"mean acceptance length τ {result.mean_acceptance_length:.2f}")
