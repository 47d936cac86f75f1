"""`bench --chain`: dependent calls through the real server, each prompt carrying the previous answer."""

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("tritonclient.grpc")


def _local_chain(pair, prompts: list[list[int]], max_new: int) -> list[int]:
    from dflash_trt.decoding.autoregressive import autoregressive_generate
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.tokenizer import stop_token_ids

    stops = stop_token_ids(pair.tokenizer, pair.target.config.eos_token_ids)
    answer: list[int] = []
    for prompt in prompts:
        result = autoregressive_generate(pair.target, [Request(tuple(prompt + answer), stop=StopCriteria(max_new, stops))])[0]
        answer = result.tokens[:-1] if result.finish_reason == "stop" else result.tokens
    return answer


@pytest.mark.integration
def test_a_served_chain_hands_each_answer_to_the_next_call(served):
    from dflash_trt.bench.chain import run_chain
    from dflash_trt.bench.local import load_prompts

    server, pair, _ = served
    prompts = [p[:40] for p in load_prompts(None, None, 3, served=True)]
    seconds, per_call, tokens, answer = run_chain(server.grpc_url, "dflash", prompts, 3, 12, 0.0, 0)
    assert answer == _local_chain(pair, prompts, 12)
    assert len(per_call) == 3 and seconds >= sum(per_call) and tokens >= len(answer)


@pytest.mark.integration
def test_bench_chain_cli_compares_both_models_and_writes_the_plot(served, tmp_path):
    from dflash_trt.cli import cli

    server = served[0]
    out = tmp_path / "chains"
    result = CliRunner().invoke(cli, ["bench", "--url", server.grpc_url, "--chain", "3", "--concurrency", "1,2",
                                       "--max-new-tokens", "8", "--num-prompts", "6", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["answers_identical"] == {"1": True, "2": True}
    assert {(p["model"], p["parallel"]) for p in data["points"]} == {(m, k) for m in ("dflash", "dflash_ar") for k in (1, 2)}
    assert all(len(p["latencies_s"]) == max(4, 2 * p["parallel"]) and len(p["call_s"]) == 3 * len(p["latencies_s"])
               for p in data["points"])
    assert (out / "chain_latency.png").stat().st_size > 1000
    assert "chain latency" in result.output


def test_chain_needs_a_server():
    from dflash_trt.cli import cli

    result = CliRunner().invoke(cli, ["bench", "--chain", "3"])
    assert result.exit_code != 0 and "add --url" in result.output
