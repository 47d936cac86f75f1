"""PNG plots for benchmark results: latency–throughput Pareto curve and acceptance-length histogram."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def pareto_plot(points, path: str | Path) -> Path:
    """Total output tokens/s vs per-user tokens/s, one curve per model, points labelled by concurrency."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 5), dpi=110)
    for model in sorted({p.model for p in points}):
        mine = sorted((p for p in points if p.model == model), key=lambda p: p.concurrency)
        xs, ys = [p.per_user_tokens_per_s for p in mine], [p.output_tokens_per_s for p in mine]
        ax.plot(xs, ys, marker="o", label=model)
        for p, x, y in zip(mine, xs, ys):
            ax.annotate(f"c={p.concurrency}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("per-user output tokens/s (interactivity)")
    ax.set_ylabel("total output tokens/s (throughput)")
    ax.set_title("DFlash vs autoregressive: latency–throughput")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def acceptance_histogram(series: dict[str, list[int]], block_size: int, path: str | Path) -> Path:
    """Share of verify steps committing n tokens (n = 1..block_size), one bar group per series."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    names = list(series)
    width = 0.8 / max(1, len(names))
    for i, name in enumerate(names):
        lengths = series[name]
        total = max(1, len(lengths))
        xs = [n + (i - (len(names) - 1) / 2) * width for n in range(1, block_size + 1)]
        ax.bar(xs, [lengths.count(n) / total for n in range(1, block_size + 1)], width=width, label=name)
    ax.set_xlabel("tokens committed per verify step (acceptance length)")
    ax.set_ylabel("share of verify steps")
    ax.set_xticks(range(1, block_size + 1))
    ax.set_title("acceptance-length histogram")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def temperature_plot(results, path: str | Path) -> Path:
    """τ and speed-up over AR against the temperature, one line per block size (local results)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for block in sorted({r.block_size for r in results}):
        mine = sorted((r for r in results if r.block_size == block), key=lambda r: r.temperature)
        ts = [r.temperature for r in mine]
        left.plot(ts, [r.mean_acceptance_length for r in mine], marker="o", label=f"block {block}")
        right.plot(ts, [r.speedup for r in mine], marker="o", label=f"block {block}")
    right.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    left.set_xlabel("temperature")
    left.set_ylabel("τ (mean acceptance length)")
    right.set_xlabel("temperature")
    right.set_ylabel("DFlash / autoregressive speed")
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("DFlash at temperature > 0 (coupled drafts), same prompts, tokens identical to AR")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def context_plot(rows: list[dict], path: str | Path) -> Path:
    """τ and DFlash / AR speed against the prompt's length, one line per series. `rows`: dicts with series,
    context_length, tau, speedup (optionally speedup_ci95 [lo, hi], drawn as error bars, and decode_speedup: the
    ratio after the prompt is in, dashed)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for name in dict.fromkeys(r["series"] for r in rows):
        mine = sorted((r for r in rows if r["series"] == name), key=lambda r: r["context_length"])
        xs = [r["context_length"] for r in mine]
        left.plot(xs, [r["tau"] for r in mine], marker="o", label=name)
        if all("speedup_ci95" in r for r in mine):
            errors = [[r["speedup"] - r["speedup_ci95"][0] for r in mine],
                      [r["speedup_ci95"][1] - r["speedup"] for r in mine]]
            line = right.errorbar(xs, [r["speedup"] for r in mine], yerr=errors, marker="o", capsize=3, label=name)[0]
        else:
            (line,) = right.plot(xs, [r["speedup"] for r in mine], marker="o", label=name)
        if all("decode_speedup" in r for r in mine):
            right.plot(xs, [r["decode_speedup"] for r in mine], marker="s", linestyle="--", color=line.get_color(),
                       label=f"{name}, decode only")
    right.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    left.set_ylabel("τ (mean acceptance length)")
    right.set_ylabel("DFlash / autoregressive speed")
    lengths = sorted({r["context_length"] for r in rows})
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("prompt length (tokens)")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("DFlash by context length, same prompts both ways, one run")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def chain_plot(points, path: str | Path) -> Path:
    """End-to-end chain latency per model and number of parallel chains: one box per (model, K)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    levels = sorted({p.parallel for p in points})
    models = sorted({p.model for p in points})
    width = 0.8 / max(1, len(models))
    for i, model in enumerate(models):
        mine = {p.parallel: p for p in points if p.model == model}
        xs = [j + (i - (len(models) - 1) / 2) * width for j, k in enumerate(levels) if k in mine]
        data = [mine[k].latencies_s for k in levels if k in mine]
        box = ax.boxplot(data, positions=xs, widths=width * 0.9, patch_artist=True)
        for patch in box["boxes"]:
            patch.set_facecolor(f"C{i}")
        ax.plot([], [], color=f"C{i}", linewidth=8, label=model)
    ax.set_xticks(range(len(levels)), [f"{k} parallel" for k in levels])
    calls = points[0].calls if points else 0
    ax.set_ylabel("chain latency, s (end to end)")
    ax.set_title(f"agent chains of {calls} dependent calls: DFlash vs autoregressive")
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)


def replay_plot(points, path: str | Path) -> Path:
    """Mean session latency and mean TTFT per variant (model x prefix cache), one group per concurrency."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.5), dpi=110)
    levels = sorted({p.concurrency for p in points})
    variants = sorted({(p.model, p.cache) for p in points}, key=lambda v: (v[0], not v[1]))
    width = 0.8 / max(1, len(variants))
    for ax, key, label in ((axes[0], "session_mean_s", "mean session latency, s"),
                           (axes[1], "ttft_mean_s", "mean time to first token, s")):
        for i, (model, cache) in enumerate(variants):
            mine = {p.concurrency: p.to_dict()[key] for p in points if (p.model, p.cache) == (model, cache)}
            xs = [j + (i - (len(variants) - 1) / 2) * width for j, k in enumerate(levels) if k in mine]
            ax.bar(xs, [mine[k] for k in levels if k in mine], width * 0.9,
                   label=f"{model}, cache {'on' if cache else 'off'}")
        ax.set_xticks(range(len(levels)), [f"{k} sessions at once" for k in levels])
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle("multi-turn replay: DFlash vs autoregressive, prefix cache on / off")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return Path(path)
