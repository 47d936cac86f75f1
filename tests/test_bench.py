"""`dflash-trt bench`: results JSON follows the documented schema; PNG plots render and are not blank."""

import json

import pytest
from click.testing import CliRunner
from plot_checks import png_ok

from dflash_trt.bench.plots import acceptance_histogram, pareto_plot
from dflash_trt.bench.served import ServedPoint, scaling
from dflash_trt.cli import cli

pytest.importorskip("matplotlib.image")  # the plots need matplotlib


def test_local_bench_writes_schema_and_histogram(tiny_pair, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"token_ids": [i + 1, i + 2, i + 3]}) + "\n" for i in range(3)))
    result = CliRunner().invoke(cli, ["bench", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
                                      "--prompts", str(prompts), "--block-sizes", "2,4", "--max-new-tokens", "8",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["schema_version"] == 1 and data["mode"] == "local"
    assert [r["block_size"] for r in data["results"]] == [2, 4]
    assert data["draft_confidence"] == 0.1 and data["draft_vocab_size"] is None  # CPU default; no vocabulary file
    for r in data["results"]:
        assert r["identical"] is True and r["generated_tokens"] == 24
        assert {"mean_acceptance_length", "per_position_acceptance", "spec_tokens_per_s", "ar_tokens_per_s",
                "speedup", "acceptance_histogram"} <= set(r)
        assert len(r["per_position_acceptance"]) == r["block_size"] - 1
        lo, hi = r["speedup_ci95"]
        assert lo <= r["speedup"] <= hi
    png_ok(tmp_path / "out" / "acceptance_histogram.png")


def test_local_bench_takes_a_temperature_list_and_plots_tau_against_it(tiny_pair, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"token_ids": [i + 1, i + 2, i + 3]}) + "\n" for i in range(2)))
    result = CliRunner().invoke(cli, ["bench", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
                                      "--prompts", str(prompts), "--block-sizes", "4", "--max-new-tokens", "8",
                                      "--temperature", "0,0.7,1.5", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert [r["temperature"] for r in data["results"]] == [0.0, 0.7, 1.5]
    assert all(r["identical"] for r in data["results"])  # tokens equal AR's at every temperature
    assert data["sampling"]["temperatures"] == [0.0, 0.7, 1.5]
    png_ok(tmp_path / "out" / "tau_vs_temperature.png")
    bad = CliRunner().invoke(cli, ["bench", "--temperature", "0,-1"])
    assert bad.exit_code == 2 and "numbers >= 0" in bad.output


def test_context_prompts_end_where_prompts_end_and_never_repeat():
    from dflash_trt.bench.local import context_prompts
    from dflash_trt.errors import ConfigError

    prompts = [list(range(100 * i, 100 * i + 10)) for i in range(6)]  # 60 tokens, every one distinct
    cut = context_prompts(prompts, 25, 3)
    assert [len(p) for p in cut] == [25, 25, 25]
    assert [p[-1] for p in cut] == [209, 409, 509]  # prompt ends spread over the 4 with 25 tokens before them
    assert cut[0] == list(range(5, 10)) + list(range(100, 110)) + list(range(200, 210))
    assert context_prompts(prompts, 60, 5) == [sum(prompts, [])]  # only the last end has 60 tokens before it
    assert [p[-1] for p in context_prompts(prompts, 25, 9)] == [209, 309, 409, 509]  # fewer ends than asked: all
    with pytest.raises(ConfigError, match="60 tokens in all, fewer than --context-lengths 61"):
        context_prompts(prompts, 61, 2)
    with pytest.raises(ConfigError, match="'token_ids'"):
        context_prompts(["some text"], 4, 1)


def test_local_bench_by_context_length(tmp_path):
    """The shipped pair on held-out prompts cut to 64 and 256 tokens: a row per length, tokens identical to AR,
    and the plot; a length past the target's positions is refused before anything runs."""
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, ["bench", "--block-sizes", "16", "--num-prompts", "2", "--max-new-tokens", "16",
                                      "--context-lengths", "64,256", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["context_lengths"] == [64, 256]
    assert [(r["context_length"], r["prompts"]) for r in data["results"]] == [(64, 2), (256, 2)]
    assert all(r["identical"] and r["generated_tokens"] == 2 * 16 for r in data["results"])
    for r in data["results"]:  # the prefill share of each side is part of its seconds
        assert 0 < r["spec_prefill_seconds"] < r["spec_seconds"] and 0 < r["ar_prefill_seconds"] < r["ar_seconds"]
        ar_decode = r["ar_seconds"] - r["ar_prefill_seconds"]
        assert r["decode_speedup"] == pytest.approx(ar_decode / (r["spec_seconds"] - r["spec_prefill_seconds"]))
    png_ok(out / "context_lengths.png")
    refused = CliRunner().invoke(cli, ["bench", "--context-lengths", "16380", "--max-new-tokens", "64"])
    assert refused.exit_code == 1 and "--context-lengths 16380" in refused.output
    assert "16384 positions" in refused.output


def test_pareto_and_histogram_plots_render(tmp_path):
    points = [ServedPoint(model, c, 8, 2.0 / c ** 0.5, 400, 0.05 * c, 0.08 * c, 0.01 * c, 100.0 / c ** 0.3, 3.0,
                          [1, 2, 3, 4, 4, 5] * c)
              for model in ("dflash", "dflash_ar") for c in (1, 2, 4, 8)]
    png_ok(pareto_plot(points, tmp_path / "pareto.png"))
    png_ok(acceptance_histogram({"a": [1, 2, 2, 3], "b": [4, 4, 5]}, 6, tmp_path / "h.png"))
    ratios = scaling(points)
    assert ratios[1] == 1.0 and ratios[8] > ratios[2]


def test_served_point_per_position_acceptance_from_committed_lengths():
    point = ServedPoint("dflash", 1, 1, 1.0, 10, 0.1, 0.1, 0.01, 10.0, 2.5, [1, 3, 2, 4])
    assert point.per_position_acceptance == [0.75, 0.5, 0.25]  # steps committing > 1, > 2, > 3 tokens
    assert point.to_dict()["per_position_acceptance"] == [0.75, 0.5, 0.25]
    assert ServedPoint("dflash_ar", 1, 1, 1.0, 0, 0.1, 0.1, 0.01, 10.0, 0.0).per_position_acceptance == []


def test_local_bench_races_the_zlab_reference_with_identical_tokens(tiny_pair, tmp_path):
    pytest.importorskip("dflash.model")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"token_ids": [i + 5, 9, i + 7, 3]}) + "\n" for i in range(2)))
    args = ["bench", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--prompts", str(prompts),
            "--block-sizes", "4", "--max-new-tokens", "12", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(cli, args + ["--reference"])
    assert result.exit_code == 0, result.output
    assert "dflash_generate" in result.output
    (comparison,) = json.loads((tmp_path / "out" / "results.json").read_text())["reference"]
    assert comparison["block_size"] == 4 and comparison["prompts"] == 2
    assert comparison["identical_prompts"] == 2 and comparison["generated_tokens"] == 24
    assert comparison["speedup"] > 0 and comparison["reference_tokens_per_s"] > 0
    refused = CliRunner().invoke(cli, args + ["--reference", "--temperature", "0.7"])
    assert refused.exit_code == 2 and "--reference" in refused.output and "greedy" in refused.output


def test_local_bench_gives_each_prompt_its_own_seed(tiny_pair):
    """One seed for every prompt drew the same noise at the same positions in each (the same prompt twice
    sampled the same tokens); prompt i samples with seed + i, as served mode's requests do."""
    from dflash_trt.bench.local import prompt_requests
    from dflash_trt.decoding.autoregressive import autoregressive_generate
    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.model.loader import load_pair

    pair = load_pair(tiny_pair[0], tiny_pair[1], "fp32", "cpu")
    same = [[5, 6, 7]] * 3
    requests = prompt_requests(same, SamplingParams(1.5, seed=40), 16)
    assert [r.params.seed for r in requests] == [40, 41, 42] and all(r.params.temperature == 1.5 for r in requests)
    outputs = [tuple(g.tokens) for g in autoregressive_generate(pair.target, requests)]
    assert len(set(outputs)) == 3  # the same prompt, three different samples


def test_speedup_interval_spans_what_the_prompts_disagree_on():
    """The local bench's 95% interval of the speed-up: prompts resampled with their DFlash and AR seconds kept
    together. Prompts that agree give a point; prompts that disagree give an interval around the ratio of sums."""
    from dflash_trt.bench.local import speedup_interval

    assert speedup_interval([(1.0, 2.0)] * 8) == (2.0, 2.0)  # every prompt 2x: no doubt
    pairs = [(1.0, 2.0), (1.0, 0.8), (2.0, 3.0), (1.0, 1.1), (0.5, 1.5), (1.0, 0.9)] * 3
    lo, hi = speedup_interval(pairs)
    ratio = sum(ar for _, ar in pairs) / sum(spec for spec, _ in pairs)
    assert lo < ratio < hi and 0.8 < lo and hi < 2.0
    assert speedup_interval(pairs) == (lo, hi)  # seeded: a run reports one interval
    assert speedup_interval(pairs * 4)[1] - speedup_interval(pairs * 4)[0] < hi - lo  # more prompts, narrower
