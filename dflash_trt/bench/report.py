"""Tables for benchmark results (rich)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

_console = Console(width=160)


def say(message: str) -> None:
    _console.print(message)


def print_local(results, caption: str | None = None) -> None:
    table = Table(title="DFlash vs autoregressive (local engine, batch 1, same prompts, one run)",
                  caption=caption)
    lengths = any(r.context_length for r in results)
    for column in ("T", "block", *(["context"] if lengths else []), "prompts", "tokens", "τ", "DFlash tok/s",
                   "AR tok/s", "speed-up (95% interval)", "decode only", "identical", "accepted, drafts 1-5"):
        table.add_column(column, justify="right")
    for r in results:
        rates = " ".join(f"{p:.2f}" for p in r.per_position_acceptance[:5]) + (" …" if r.block_size > 6 else "")
        lo, hi = r.speedup_interval  # a bootstrap: computed once a row
        table.add_row(f"{r.temperature:g}", str(r.block_size), *([str(r.context_length)] if lengths else []),
                      str(r.prompts), str(r.generated_tokens), f"{r.mean_acceptance_length:.2f}",
                      f"{r.spec_tokens_per_s:.1f}", f"{r.ar_tokens_per_s:.1f}",
                      f"{r.speedup:.2f}x ({lo:.2f}-{hi:.2f})", f"{r.decode_speedup:.2f}x",
                      "yes" if r.identical else "NO", rates)
    _console.print(table)


def print_reference(comparisons) -> None:
    table = Table(title="dflash-trt vs z-lab dflash_generate (dflash==0.1.0), batch 1, fp32, greedy, alternating")
    for column in ("block", "prompts", "tokens", "dflash-trt tok/s", "reference tok/s", "speed-up", "identical"):
        table.add_column(column, justify="right")
    for c in comparisons:
        table.add_row(str(c.block_size), str(c.prompts), str(c.generated_tokens),
                      f"{c.generated_tokens / c.ours_seconds:.1f}", f"{c.generated_tokens / c.reference_seconds:.1f}",
                      f"{c.speedup:.2f}x", f"{c.identical_prompts}/{c.prompts}")
    _console.print(table)


def print_served(points, ratios: dict[int, float]) -> None:
    table = Table(title="served: DFlash (dflash) vs autoregressive (dflash_ar), gRPC streaming, one run")
    lengths = any(p.context_length for p in points)
    for column in ("model", "T", *(["context"] if lengths else []), "concurrency", "requests", "output tok/s",
                   "per-user tok/s", "TTFT ms", "TTFT p90 ms", "TPOT ms", "τ", "acceptance by draft position"):
        table.add_column(column, justify="right")
    for p in points:
        rates = p.per_position_acceptance if p.model == "dflash" else []
        table.add_row(p.model, f"{p.temperature:g}", *([str(p.context_length)] if lengths else []), str(p.concurrency),
                      str(p.requests), f"{p.output_tokens_per_s:.1f}",
                      f"{p.per_user_tokens_per_s:.1f}", f"{p.ttft_mean_s * 1e3:.0f}", f"{p.ttft_p90_s * 1e3:.0f}",
                      f"{p.tpot_mean_s * 1e3:.1f}", f"{p.mean_acceptance_length:.2f}" if p.model == "dflash" else "-",
                      " ".join(f"{r:.2f}" for r in rates[:6]) + (" …" if len(rates) > 6 else "") or "-")
    _console.print(table)
    by = {(p.model, p.concurrency, p.temperature, p.context_length): p for p in points}
    for model, c, t, length in by:
        if model == "dflash" and ("dflash_ar", c, t, length) in by:
            ratio = by[model, c, t, length].output_tokens_per_s / by["dflash_ar", c, t, length].output_tokens_per_s
            where = f", {length}-token prompts" if length else ""
            _console.print(f"T {t:g}, concurrency {c}{where}: DFlash / autoregressive throughput = {ratio:.2f}x")
    for c, r in ratios.items():
        _console.print(f"DFlash throughput at concurrency {c} = {r:.2f}x concurrency 1")


def print_chains(points, speedups: dict[int, float], identical: dict[int, bool]) -> None:
    calls = points[0].calls if points else 0
    table = Table(title=f"agent chains: {calls} dependent calls each, gRPC streaming, one run")
    for column in ("model", "parallel chains", "chains", "mean s", "p50 s", "p90 s", "stdev s", "per call ms"):
        table.add_column(column, justify="right")
    for p in points:
        table.add_row(p.model, str(p.parallel), str(len(p.latencies_s)), f"{p.mean_s:.2f}", f"{p.quantile(0.5):.2f}",
                      f"{p.quantile(0.9):.2f}", f"{p.stdev_s:.2f}", f"{sum(p.call_s) / len(p.call_s) * 1e3:.0f}")
    _console.print(table)
    for k, ratio in speedups.items():
        same = identical.get(k)
        note = "" if points[0].temperature > 0 else (", answers identical" if same else ", ANSWERS DIFFER")
        _console.print(f"{k} parallel chains: DFlash chain latency = {ratio:.2f}x faster than autoregressive{note}")


def print_replay(points, summaries: list[dict]) -> None:
    table = Table(title="multi-turn replay: sessions through dflash / dflash_ar, prefix cache on / off, one run")
    for column in ("model", "prefix cache", "sessions at once", "session mean s", "tokens/s", "TTFT ms", "τ",
                   "prompt cached"):
        table.add_column(column, justify="right")
    for p in points:
        d = p.to_dict()
        table.add_row(p.model, "on" if p.cache else "off", str(p.concurrency), f"{d['session_mean_s']:.2f}",
                      f"{d['output_tokens_per_s']:.1f}", f"{d['ttft_mean_s'] * 1e3:.0f}",
                      f"{d['tau']:.2f}" if p.model == "dflash" else "-", f"{d['cached_share']:.0%}")
    _console.print(table)
    for s in summaries:
        warm = s["warm_ttft_over_cold"]
        _console.print(
            f"{s['concurrency']} at once: session latency, DFlash + cache = "
            f"{s['session_speedup_vs_ar_without_cache']:.2f}x faster than AR without it, "
            f"{s['session_speedup_vs_dflash_without_cache']:.2f}x than DFlash without it; "
            f"TTFT of {s['warm_turns']} turns >= 90% cached = "
            + (f"{warm:.2f}x the same turns cold" if warm is not None else "n/a")
            + f"; τ warm / cold = {s['tau_warm_over_cold']:.3f}; throughput with / without the cache = "
            f"{s['throughput_with_over_without_cache']:.2f}x; answers "
            + ("identical four ways" if s["answers_identical"] else "DIFFER"))
