"""`dflash-trt bench`: DFlash vs autoregressive decoding measured side by side in one run."""

from __future__ import annotations

import click

from dflash_trt.cli.types import (
    BUILTIN_DRAFT,
    BUILTIN_TARGET,
    DRAFT_VOCAB,
    DRAFT_VOCAB_HELP,
    FLOAT_LIST,
    INT_LIST,
    MODEL_DIR,
)


@click.command("bench", short_help="Benchmark DFlash against autoregressive decoding (local or served).")
@click.option("--url", help="Benchmark a served repository (gRPC host:port) instead of the local runtime.")
@click.option("--target", type=MODEL_DIR, default=BUILTIN_TARGET, show_default=True, help="Local mode: HF target.")
@click.option("--draft", type=MODEL_DIR, default=BUILTIN_DRAFT, show_default=True, help="Local mode: drafter.")
@click.option("--prompts", "prompts_path", type=click.Path(exists=True, dir_okay=False),
              help="JSONL with token_ids or text per line (default: the shipped held-out prompts).")
@click.option("--num-prompts", type=click.IntRange(min=1),
              help="Default: 16 locally; served, 4 requests per slot of the highest concurrency (at least 16), "
                   "so the draining last wave does not dominate the throughput.")
@click.option("--block-sizes", type=INT_LIST, default="8,16", show_default=True, help="Local mode.")
@click.option("--concurrency", type=INT_LIST, default="1,2,4,8", show_default=True, help="Served mode sweep.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--temperature", "temperatures", type=FLOAT_LIST, default="0", show_default=True,
              help="One or more temperatures (comma list): each is run in full, τ and speed-up per temperature.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="Local mode.")
@click.option("--threads", type=click.IntRange(min=1), help="Local mode: CPU intra-op threads (DFLASH_TRT_CPU_THREADS).")
@click.option("--draft-confidence", type=click.FloatRange(min=0, max=1, max_open=True),
              help="Local mode: verify only the drafts whose running draft probability is >= this "
                   "(runtime.draft_confidence; 0 = full blocks). Default: 0.1 on CPU (extra verified rows "
                   "cost there), 0 on GPUs.")
@click.option("--width-policy", type=click.Choice(["schedule", "measured", "auto"]), default="auto", show_default=True,
              help="Local mode, as runtime.width_policy: 'schedule' verifies full blocks; 'measured' picks each step's "
                   "width from measured acceptance and step costs, down to plain AR steps (a lone greedy request "
                   "keeps full blocks); 'auto' is measured on CPU, schedule on GPUs.")
@click.option("--draft-vocab", type=DRAFT_VOCAB, default="auto", show_default=True, help="Local mode. " + DRAFT_VOCAB_HELP)
@click.option("--reference", is_flag=True, help="Local mode: also race z-lab's dflash_generate (dflash==0.1.0) on "
              "the same prompts, alternating, and check its tokens are identical (greedy only).")
@click.option("--chain", "chain_calls", type=click.IntRange(min=1),
              help="Served mode: agent chains of this many dependent calls (each prompt carries the previous "
                   "answer); --concurrency is then the number of chains side by side. End-to-end chain latency, "
                   "DFlash vs AR.")
@click.option("--trace", help="Served mode: replay multi-turn sessions from this trace (sessions of messages, or "
              "aiperf / mooncake request lines; builtin:agents = the shipped agent workload): dflash and dflash_ar, "
              "prefix cache on and off, --concurrency sessions at a time (docs/benchmarks.md).")
@click.option("--rounds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Served mode: send each point's requests this many times per model, the models alternating "
                   "in order (A B, B A, ...), pooled per point: a drifting machine then favours neither.")
@click.option("--context-lengths", type=INT_LIST,
              help="Cut the prompts to each of these lengths (tokens; each ends where a prompt ends and reaches back "
                   "over the ones before it) and report τ, tokens/s and the speed-up per length: local or --url. "
                   "Without --prompts: the shipped long held-out set (dflash_trt/assets/heldout_long.jsonl).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="out/bench", show_default=True,
              help="Folder for results.json and the PNG plots.")
def bench_command(url, target, draft, prompts_path, num_prompts, block_sizes, concurrency, max_new_tokens,
                  temperatures, seed, device, threads, width_policy, draft_vocab, draft_confidence, reference,
                  chain_calls, trace, rounds, context_lengths, out_dir):
    """Same prompts, both ways, in one run: τ, per-position acceptance, tokens/s, TTFT/TPOT, speed-up.

    Local: batch-1 decoding through the engine (the scheduler and runners a server runs) for each block size.
    Served (--url): a concurrency sweep against the `dflash` and `dflash_ar` models of one server; writes a
    Pareto plot.
    """
    import os

    from dflash_trt.bench import runner

    if threads:
        os.environ["DFLASH_TRT_CPU_THREADS"] = str(threads)
    sampling = {"temperatures": temperatures, "seed": seed}
    if reference:
        from dflash_trt.bench.reference import require_reference

        if url or max(temperatures) > 0:
            raise click.BadParameter("compares local greedy decoding: drop --url and --temperature",
                                     param_hint="--reference")
        require_reference()
    if draft_confidence is None:
        from dflash_trt.runtime.local import default_draft_confidence

        draft_confidence = default_draft_confidence(device)
    if (chain_calls or trace) and not url:
        raise click.BadParameter("this runs through a server: add --url HOST:GRPC_PORT",
                                 param_hint="--chain" if chain_calls else "--trace")
    if context_lengths and min(context_lengths) < 1:
        raise click.BadParameter("lengths are numbers of tokens >= 1", param_hint="--context-lengths")
    context_lengths = sorted(set(context_lengths)) if context_lengths else None
    if context_lengths and (trace or chain_calls or reference):
        raise click.BadParameter("measures single requests: drop --trace, --chain and --reference",
                                 param_hint="--context-lengths")
    if trace:
        if len(temperatures) > 1 or chain_calls:
            raise click.BadParameter("a replay runs at one temperature, without --chain", param_hint="--trace")
        runner.run_replay(url, trace, concurrency, sampling, out_dir)
    elif chain_calls:
        if len(temperatures) > 1:
            raise click.BadParameter("chains run at one temperature", param_hint="--temperature")
        runner.run_chains(url, prompts_path, num_prompts or 16, chain_calls, concurrency, max_new_tokens, sampling,
                          out_dir)
    elif url:
        num_prompts = num_prompts or max(16, 4 * max(concurrency))
        runner.run_served(url, prompts_path, num_prompts, concurrency, max_new_tokens, sampling, out_dir, rounds,
                          context_lengths)
    else:
        runner.run_local(target, draft, prompts_path, num_prompts or 16, block_sizes, max_new_tokens, sampling, device,
                         out_dir, reference, draft_confidence, draft_vocab, width_policy, context_lengths)
