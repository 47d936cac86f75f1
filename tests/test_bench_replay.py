"""`dflash-trt bench --url URL --trace FILE`: multi-turn sessions replayed four ways (dflash / dflash_ar, prefix
cache on / off) against the real tritonserver; both trace formats; the shipped agent workload loads."""

import json

import pytest
from click.testing import CliRunner

from dflash_trt.bench.replay import MOONCAKE_BLOCK, load_trace
from dflash_trt.cli import cli
from dflash_trt.errors import ConfigError


def test_the_shipped_agent_workload_and_both_formats_load(tmp_path):
    sessions = load_trace("builtin:agents")
    assert len(sessions) == 8 and all(len(s.turns) == 4 for s in sessions)
    assert [t.fresh for t in sessions[0].turns] == [True, True, False, True]
    assert "{previous}" in sessions[0].turns[1].messages[-1]
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 700, "output_length": 9, "hash_ids": [4, 7]}) + "\n"
                     + json.dumps({"timestamp": 50, "input_length": 600, "output_length": 9, "hash_ids": [4, 8]}))
    a, b = load_trace(str(trace))
    (ta,), (tb,) = a.turns, b.turns
    assert len(ta.input_ids) == 700 and ta.input_ids[:MOONCAKE_BLOCK] == tb.input_ids[:MOONCAKE_BLOCK]  # same hash id
    assert ta.input_ids[MOONCAKE_BLOCK:600] != tb.input_ids[MOONCAKE_BLOCK:600] and tb.start_s == 0.05
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"turns": [{"messages": "hello"}]}))
    with pytest.raises(ConfigError, match=r"bad.jsonl:1: field 'turns\[0\].messages'"):
        load_trace(str(bad))


@pytest.mark.integration
def test_replay_compares_four_ways_and_restores_prefixes(served, tmp_path):
    server = served[0]
    system = "import os\nimport sys\n\n" * 40  # ~ several blocks shared by every session
    sessions = [{"session": f"s{i}", "turns": [
        {"fresh": True, "max_tokens": 12, "messages": [{"role": "system", "content": system},
                                                        {"role": "user", "content": f"def task_{i}(x):"}]},
        {"max_tokens": 12, "messages": [{"role": "user", "content": "    return {previous}"}]}]} for i in range(3)]
    trace = tmp_path / "sessions.jsonl"
    trace.write_text("\n".join(json.dumps(s) for s in sessions))
    out = tmp_path / "replay"
    result = CliRunner().invoke(cli, ["bench", "--url", server.grpc_url, "--trace", str(trace), "--concurrency", "1,2",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert {(p["model"], p["prefix_cache"], p["concurrency"]) for p in data["points"]} == \
        {(m, c, k) for m in ("dflash", "dflash_ar") for c in (True, False) for k in (1, 2)}
    for p in data["points"]:
        turns = p["turns"]
        assert len(turns) == 6 and all(t["output_tokens"] == 12 for t in turns)
        cached = sum(t["cached_tokens"] for t in turns)
        assert (cached > 0) == p["prefix_cache"]  # "off" requests neither restore nor leave blocks
    assert all(s["answers_identical"] for s in data["summary"])
    warm = [t for p in data["points"] if p["prefix_cache"] for t in p["turns"] if t["turn"] == 1]
    assert all(t["cached_tokens"] >= 0.8 * t["prompt_tokens"] for t in warm)  # a follow-up turn: its history
    assert (out / "replay.png").stat().st_size > 1000 and "multi-turn replay" in result.output


def test_a_replay_needs_a_server_and_a_trace_that_exists(tmp_path):
    result = CliRunner().invoke(cli, ["bench", "--trace", "builtin:agents"])
    assert result.exit_code != 0 and "add --url" in result.output
    result = CliRunner().invoke(cli, ["bench", "--url", "127.0.0.1:1", "--trace", str(tmp_path / "none.jsonl")])
    assert result.exit_code != 0 and "no such file" in result.output
