"""CLI option parsing (make_context) and whole `generate` runs (CliRunner)."""

import json

import click
import pytest
from click.testing import CliRunner

from dflash_trt.cli import cli, generate_command


def _ctx(*args):
    return generate_command.make_context("generate", ["--target", "t", "--draft", "d", *args])


def test_prompt_ids_parse_as_int_list():
    assert _ctx("--prompt-ids", "1, 9,17").params["prompt_ids"] == [1, 9, 17]


@pytest.mark.parametrize("args", [
    ["--prompt-ids", "1,x"], ["--top-p", "0"], ["--top-p", "1.5"], ["--temperature", "-1"],
    ["--top-k", "-2"], ["--max-new-tokens", "0"], ["--block-size", "1"], ["--dtype", "int4"],
])
def test_bad_options_are_rejected_by_click(args):
    with pytest.raises(click.BadParameter):
        _ctx(*args)


def test_help_lists_commands_without_heavy_imports():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0 and "generate" in result.output


def test_generate_json_reports_ids_and_matches_autoregressive(tiny_pair):
    target, draft = tiny_pair[0], tiny_pair[1]
    args = ["generate", "--target", str(target), "--draft", str(draft), "--prompt-ids", "5,6,7,8",
            "--max-new-tokens", "12", "--temperature", "0.8", "--top-k", "20", "--seed", "3",
            "--block-size", "4", "--compare-ar", "--json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["prompt_ids"] == [5, 6, 7, 8] and len(out["token_ids"]) == 12
    assert out["matches_autoregressive"] is True
    assert len(out["stats"]["per_position_acceptance"]) == 3
    assert out["stats"]["mean_acceptance_length"] >= 1.0


def test_compare_ar_warms_both_paths_before_timing_either(tiny_pair, monkeypatch):
    """The speed-up compares warm engines: a warm-up decode of each (DFlash, AR) runs before the timed DFlash
    decode, whose first pass would otherwise pay the C++ plans and caches."""
    from dflash_trt.runtime.generate import Engine

    calls, timing = [], []
    generate, with_stats = Engine.generate, Engine.generate_with_stats

    def kind(engine):
        return "dflash" if engine.block_size > 1 else "ar"

    def untimed(self, *a, **k):
        if not timing:
            calls.append(f"warm {kind(self)}")
        return generate(self, *a, **k)

    def timed(self, *a, **k):
        calls.append(kind(self))
        timing.append(1)
        try:
            return with_stats(self, *a, **k)
        finally:
            timing.pop()

    monkeypatch.setattr(Engine, "generate", untimed)
    monkeypatch.setattr(Engine, "generate_with_stats", timed)
    args = ["generate", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]), "--prompt-ids", "5,6,7",
            "--max-new-tokens", "6", "--json"]
    assert CliRunner().invoke(cli, args).exit_code == 0 and calls == ["dflash"]  # no comparison: no warm-up
    calls.clear()
    result = CliRunner().invoke(cli, [*args, "--compare-ar"])
    assert result.exit_code == 0, result.output
    assert calls == ["warm dflash", "warm ar", "dflash", "ar"] and json.loads(result.output)["matches_autoregressive"]


def test_generate_requires_exactly_one_prompt_form(tiny_pair):
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1])])
    assert result.exit_code == 2 and "exactly one of --prompt or --prompt-ids" in result.output


def test_text_prompt_without_tokenizer_is_a_clear_error(tiny_pair):
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
                                      "--prompt", "hello"])
    assert result.exit_code == 1 and "no tokenizer.json" in result.output


def test_prompt_ids_outside_vocab_are_rejected(tiny_pair):
    result = CliRunner().invoke(cli, ["generate", "--target", str(tiny_pair[0]), "--draft", str(tiny_pair[1]),
                                      "--prompt-ids", "1,999"])
    assert result.exit_code == 1 and "outside the vocabulary" in result.output
