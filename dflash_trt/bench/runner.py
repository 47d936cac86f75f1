"""Bench orchestration: load, warm up, run with progress bars, then write JSON, tables and plots."""

from __future__ import annotations

import json
import platform
import time
from dataclasses import replace
from pathlib import Path

import torch

from dflash_trt.bench import plots, report
from dflash_trt.bench.local import bench_block_size, context_prompts, load_prompts
from dflash_trt.bench.served import scaling, sweep
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.engine.config import resolve_model_path
from dflash_trt.model.loader import apply_draft_vocab, load_pair
from dflash_trt.tokenizer import stop_token_ids

SCHEMA_VERSION = 1


def _header(mode: str, **extra) -> dict:
    return {"schema_version": SCHEMA_VERSION, "mode": mode, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": {"platform": platform.platform(), "processor": platform.processor(),
                        "torch_threads": torch.get_num_threads()}, **extra}


def _write(out_dir: str, payload: dict) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(payload, indent=2) + "\n")
    return out


def long_prompts(context_lengths) -> Path | None:
    """The default prompts of a --context-lengths run: the shipped long held-out set (None: no lengths)."""
    from dflash_trt.engine.golden import HELDOUT_LONG

    return HELDOUT_LONG if context_lengths else None


def _prompt_sets(prompts_path, prompts, num_prompts, context_lengths, positions=None, max_new_tokens=0):
    """{context length or None: prompts}: the prompts as given, or cut to each of `context_lengths`."""
    if not context_lengths:
        return {None: prompts[:num_prompts]}
    from dflash_trt.errors import ConfigError

    where = str(prompts_path or "the held-out prompts")
    sets = {}
    for length in context_lengths:
        if positions is not None and length + max_new_tokens > positions:
            raise ConfigError(f"--context-lengths {length}: with --max-new-tokens {max_new_tokens} it passes the "
                              f"target's {positions} positions (max_position_embeddings)")
        sets[length] = context_prompts(prompts, length, num_prompts, where)
    return sets


def run_local(target, draft, prompts_path, num_prompts, block_sizes, max_new_tokens, sampling, device, out_dir,
              reference=False, min_confidence=0.0, draft_vocab=None, width_policy="auto", context_lengths=None):
    from rich.progress import Progress

    pair = load_pair(resolve_model_path(target, Path.cwd()), resolve_model_path(draft, Path.cwd()), "fp32", device)
    apply_draft_vocab(pair, draft_vocab)
    prompts_path = prompts_path or long_prompts(context_lengths)
    sets = _prompt_sets(prompts_path, load_prompts(prompts_path, pair.tokenizer, None), num_prompts, context_lengths,
                        pair.target.config.dims.max_position_embeddings, max_new_tokens)
    stop_ids = stop_token_ids(pair.tokenizer, pair.target.config.eos_token_ids)
    results = []  # each (temperature, block size) warms both decoders on an untimed prompt first (bench_block_size)
    temperatures = sampling.get("temperatures") or [sampling.get("temperature", 0.0)]
    with Progress(transient=True) as progress:
        for temperature in temperatures:
            for block_size in block_sizes:
                for length, mine in sets.items():
                    task = progress.add_task(f"T {temperature:g}, block size {block_size}"
                                             + (f", {length} tokens" if length else ""), total=len(mine))
                    params = SamplingParams(temperature, seed=sampling["seed"])
                    result = bench_block_size(pair, mine, block_size, max_new_tokens, params, stop_ids,
                                              lambda: progress.advance(task), min_confidence, width_policy)
                    results.append(replace(result, context_length=length))
    vocab = pair.draft.vocab_size
    report.print_local(results, f"drafter proposes from {vocab or pair.target.config.vocab_size} tokens"
                                f"{' (draft vocabulary)' if vocab else ''}; draft confidence cut "
                                f"{min_confidence or 'off (full blocks)'}; verify widths {width_policy}")
    extra = {}
    if reference:
        comparisons = _compare_reference(pair, sets[None], block_sizes, max_new_tokens, min_confidence, width_policy)
        report.print_reference(comparisons)
        extra["reference"] = [c.to_dict() for c in comparisons]
    out = _write(out_dir, _header("local", target=str(target), draft=str(draft), max_new_tokens=max_new_tokens,
                                  sampling=sampling, draft_confidence=min_confidence,
                                  width_policy=width_policy, context_lengths=context_lengths,
                                  draft_vocab_size=pair.draft.vocab_size,
                                  results=[r.to_dict() for r in results], **extra))
    plots.acceptance_histogram({f"block {r.block_size}" + (f" T {r.temperature:g}" if len(temperatures) > 1 else "")
                                + (f", {r.context_length} tokens" if r.context_length else ""): r.acceptance_lengths
                                for r in results}, max(block_sizes), out / "acceptance_histogram.png")
    written = [out / "results.json", out / "acceptance_histogram.png"]
    if len(temperatures) > 1 and not context_lengths:
        written.append(plots.temperature_plot(results, out / "tau_vs_temperature.png"))
    if context_lengths:
        rows = [{"series": f"block {r.block_size}, T {r.temperature:g}", "context_length": r.context_length,
                 "tau": r.mean_acceptance_length, "speedup": r.speedup, "speedup_ci95": list(r.speedup_interval),
                 "decode_speedup": r.decode_speedup}
                for r in results]
        written.append(plots.context_plot(rows, out / "context_lengths.png"))
    report.say("wrote " + ", ".join(str(w) for w in written))
    return results


def _compare_reference(pair, prompts, block_sizes, max_new_tokens, min_confidence=0.0, width_policy="auto"):
    from rich.progress import Progress

    from dflash_trt.bench.reference import compare_with_reference

    comparisons = []
    with Progress(transient=True) as progress:
        for block_size in block_sizes:
            task = progress.add_task(f"vs dflash_generate, block size {block_size}", total=len(prompts))
            comparisons.append(compare_with_reference(pair, prompts, block_size, max_new_tokens,
                                                      lambda: progress.advance(task), min_confidence, width_policy))
    return comparisons


def run_served(url, prompts_path, num_prompts, levels, max_new_tokens, sampling, out_dir, rounds: int = 1,
               context_lengths=None):
    from rich.progress import Progress

    prompts_path = prompts_path or long_prompts(context_lengths)
    sets = _prompt_sets(prompts_path, load_prompts(prompts_path, None, None, served=True), num_prompts,
                        context_lengths)
    points = []
    with Progress(transient=True) as progress:
        def factory(name, total):
            task = progress.add_task(name, total=total)
            return lambda: progress.advance(task)

        for length, prompts in sets.items():
            def named(name, total, length=length):
                return factory(name + (f", {length} tokens" if length else ""), total)

            found = sweep(url, prompts, levels, max_new_tokens, sampling, progress_factory=named, rounds=rounds)
            points += [replace(p, context_length=length) for p in found]
    ratios = scaling(points)
    report.print_served(points, ratios)
    out = _write(out_dir, _header("served", url=url, max_new_tokens=max_new_tokens, sampling=sampling, rounds=rounds,
                                  context_lengths=context_lengths, points=[p.to_dict() for p in points],
                                  dflash_scaling_vs_c1=ratios))
    first = [p for p in points
             if (p.temperature, p.context_length) == (points[0].temperature, points[0].context_length)]
    plots.pareto_plot(first, out / "pareto.png")
    block = max((max(p.acceptance_lengths, default=1) for p in points), default=1)
    plots.acceptance_histogram({f"dflash c={p.concurrency}": p.acceptance_lengths for p in first
                                if p.model == "dflash"}, block, out / "acceptance_histogram.png")
    written = [out / "results.json", out / "pareto.png", out / "acceptance_histogram.png"]
    if context_lengths:
        written.append(plots.context_plot(context_rows(points), out / "context_lengths.png"))
    report.say("wrote " + ", ".join(str(w) for w in written))
    return points


def context_rows(points) -> list[dict]:
    """One row per (temperature, concurrency, context length): dflash's τ and its throughput over dflash_ar's."""
    by = {(p.model, p.temperature, p.concurrency, p.context_length): p for p in points}
    rows = []
    for (model, t, c, length), p in by.items():
        if model == "dflash" and ("dflash_ar", t, c, length) in by:
            rows.append({"series": f"served c={c}, T {t:g}", "context_length": length, "tau": p.mean_acceptance_length,
                         "speedup": p.output_tokens_per_s / by["dflash_ar", t, c, length].output_tokens_per_s})
    return rows


def run_chains(url, prompts_path, num_prompts, calls, levels, max_new_tokens, sampling, out_dir):
    from rich.progress import Progress

    from dflash_trt.bench.chain import chain_sweep, identical_answers, speedups

    prompts = load_prompts(prompts_path, None, num_prompts, served=True)
    with Progress(transient=True) as progress:
        def factory(name, total):
            task = progress.add_task(name, total=total)
            return lambda: progress.advance(task)

        points = chain_sweep(url, prompts, calls, levels, max_new_tokens, sampling, progress_factory=factory)
    ratios, same = speedups(points), identical_answers(points)
    report.print_chains(points, ratios, same)
    out = _write(out_dir, _header("chains", url=url, max_new_tokens=max_new_tokens, sampling=sampling, calls=calls,
                                  points=[p.to_dict() for p in points], speedup=ratios, answers_identical=same))
    plots.chain_plot(points, out / "chain_latency.png")
    report.say(f"wrote {out / 'results.json'}, {out / 'chain_latency.png'}")
    if sampling.get("temperatures", [0])[0] == 0 and not all(same.values()):
        raise SystemExit("greedy chains handed down different answers on dflash and dflash_ar: not lossless")
    return points


def run_replay(url, trace, levels, sampling, out_dir):
    from rich.progress import Progress

    from dflash_trt.bench.replay import VARIANTS, load_trace, replay, summary

    sessions = load_trace(trace)
    temperature = (sampling.get("temperatures") or [sampling.get("temperature", 0.0)])[0]
    points, summaries = [], []
    with Progress(transient=True) as progress:
        for level in levels:
            task = progress.add_task(f"replay, {level} sessions at once", total=len(VARIANTS) * len(sessions))
            mine = replay(url, sessions, level, temperature, sampling.get("seed", 0), lambda: progress.advance(task))
            points += mine
            summaries.append(summary(mine))
    report.print_replay(points, summaries)
    out = _write(out_dir, _header("replay", url=url, trace=str(trace), sampling=sampling, sessions=len(sessions),
                                  points=[p.to_dict() for p in points], summary=summaries))
    plots.replay_plot(points, out / "replay.png")
    report.say(f"wrote {out / 'results.json'}, {out / 'replay.png'}")
    if temperature == 0 and not all(s["answers_identical"] for s in summaries):
        raise SystemExit("greedy sessions got different answers across dflash / dflash_ar / cache on / off")
    return points, summaries
