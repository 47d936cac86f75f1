"""A real tritonserver (nvidia-pytriton's binary, CPU) serving the shipped tiny pair.

Served output == local runtime output == autoregressive output, over gRPC (streaming and not),
HTTP /generate and /generate_stream; concurrency; bad requests; cancellation; metrics.
"""

import json
import queue
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.engine.config import load_build_config
from dflash_trt.errors import RequestError
from dflash_trt.triton.client import grpc_generate, http_generate, request_inputs
from dflash_trt.triton.protocol import parse_request

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["def parse_args(argv):\n", "class Queue:\n    def __init__(self", "import os\nimport sys\n\n",
           "    for name, value in items:\n"]
PARAMS = [dict(temperature=0.0), dict(temperature=0.8, top_k=40, seed=7), dict(temperature=1.0, top_p=0.9, seed=3)]


def expected_tokens(pair, inputs_list, max_seq_len=8192):
    """Autoregressive decoding of the same requests, parsed exactly as the server parses them."""
    eos = frozenset(pair.target.config.eos_token_ids) | {pair.tokenizer.eos_token_id}
    requests = []
    for inputs in inputs_list:
        get = lambda name, i=inputs: None if name not in i else np.array(i[name] if isinstance(i[name], list) else [i[name]],
                                                                          dtype=object if name in ("text_input", "stop_words") else None)
        requests.append(parse_request(get, pair.tokenizer, max_seq_len, pair.target.config.vocab_size, eos).request)
    return [r.tokens for r in autoregressive_generate(pair.target, requests, pair.detokenize)]


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "topk", "topp"])
def test_served_equals_autoregressive_over_every_transport(served, front, params):
    server, pair, _ = served
    inputs = [request_inputs(p, max_tokens=40, **params) for p in PROMPTS[:2]]
    expected = expected_tokens(pair, inputs)
    for inp, tokens in zip(inputs, expected):
        text = pair.detokenize(tokens)
        runs = {
            "grpc-stream": grpc_generate(server.grpc_url, inp | {"stream": True}),
            "grpc": grpc_generate(server.grpc_url, inp | {"stream": False}),
            "http-generate": http_generate(server.url, inp | {"stream": False}),
            "http-generate_stream": http_generate(server.url, inp | {"stream": True}),
            "front-generate": http_generate(front, inp | {"stream": False}),
            "front-generate_stream": http_generate(front, inp | {"stream": True}),
        }
        for name, result in runs.items():
            assert result.token_ids == tokens, name
            assert result.text == text, name
            assert result.finish_reason in ("length", "stop"), name
        assert runs["grpc-stream"].responses > 2  # really streamed


def test_served_equals_local_runtime(served):
    from dflash_trt.runtime.local import generate

    """Tokens always; acceptance too for a greedy request (the preset's auto width policy keeps greedy steps
    on the schedule, i.e. full blocks at batch 1; a sampled one's widths are measured on the server)."""
    server, pair, _ = served
    runtime = load_build_config(ROOT / "build_configs" / "tiny-cpu.yaml").runtime  # the server's settings
    for params in (dict(), dict(temperature=0.7, seed=11)):
        inputs = request_inputs(PROMPTS[2], max_tokens=48, **params)
        request = parse_request(lambda n: None if n not in inputs else np.array([inputs[n]], dtype=object if n == "text_input" else None),
                                pair.tokenizer, 8192, pair.target.config.vocab_size,
                                frozenset({pair.tokenizer.eos_token_id})).request
        local, _ = generate(pair, [request], block_size=16, min_confidence=runtime.draft_confidence)
        served_result = grpc_generate(server.grpc_url, inputs)
        assert served_result.token_ids == local[0].tokens
        if not params:
            assert served_result.acceptance_lengths == local[0].acceptance_lengths


def test_sixteen_concurrent_streams_with_different_params(served):
    server, pair, _ = served
    inputs = []
    for i in range(16):
        params = dict(temperature=[0.0, 0.6, 1.0, 1.2][i % 4], top_k=[0, 20, 0, 50][i % 4],
                      top_p=[1.0, 1.0, 0.8, 0.95][i % 4], seed=1000 + i)
        inputs.append(request_inputs(PROMPTS[i % 4], max_tokens=24 + (i % 5) * 6, **params))
    expected = expected_tokens(pair, inputs)
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda inp: grpc_generate(server.grpc_url, inp), inputs))
    assert [r.token_ids for r in results] == expected


def _grpc_error(server, raw_inputs) -> str:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(server.grpc_url)
    responses = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    tensors = []
    for name, (array, dtype) in raw_inputs.items():
        t = grpcclient.InferInput(name, list(array.shape), dtype)
        t.set_data_from_numpy(array)
        tensors.append(t)
    client.async_stream_infer("dflash", tensors)
    result, error = responses.get(timeout=60)
    client.stop_stream()
    assert error is not None, "expected an error response"
    return error.message()


BAD = {
    "empty prompt": ({"text_input": (np.array([b""], dtype=object), "BYTES")}, "prompt is empty"),
    "no prompt": ({"max_tokens": (np.array([4], dtype=np.int32), "INT32")}, "'text_input' (or 'input_ids') is required"),
    "prompt too long": ({"input_ids": (np.full(8300, 5, dtype=np.int32), "INT32")}, "at most 8191"),
    "max_tokens zero": ({"text_input": (np.array([b"x = 1"], dtype=object), "BYTES"),
                         "max_tokens": (np.array([0], dtype=np.int32), "INT32")}, "must be >= 1"),
    "max_tokens huge": ({"text_input": (np.array([b"x = 1"], dtype=object), "BYTES"),
                         "max_tokens": (np.array([10**6], dtype=np.int32), "INT32")}, "exceeds this bundle's max_seq_len"),
    "top_p zero": ({"text_input": (np.array([b"x"], dtype=object), "BYTES"),
                    "top_p": (np.array([0.0], dtype=np.float32), "FP32")}, "'top_p': must be in (0, 1]"),
    "top_p above one": ({"text_input": (np.array([b"x"], dtype=object), "BYTES"),
                         "top_p": (np.array([1.5], dtype=np.float32), "FP32")}, "'top_p': must be in (0, 1]"),
    "negative temperature": ({"text_input": (np.array([b"x"], dtype=object), "BYTES"),
                              "temperature": (np.array([-0.5], dtype=np.float32), "FP32")}, "'temperature': must be >= 0"),
    "wrong dtype": ({"text_input": (np.array([b"x"], dtype=object), "BYTES"),
                     "temperature": (np.array([1], dtype=np.int32), "INT32")}, "temperature"),
    "invalid utf-8": ({"text_input": (np.array([b"\xff\xfe bad"], dtype=object), "BYTES")}, "not valid UTF-8"),
    "ids outside vocab": ({"input_ids": (np.array([1, 99999], dtype=np.int32), "INT32")}, "outside the vocabulary"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_request_gets_clear_error_and_server_keeps_serving(served, case):
    server, pair, _ = served
    raw, fragment = BAD[case]
    assert fragment in _grpc_error(server, raw)
    good = grpc_generate(server.grpc_url, request_inputs("x = 1\n", max_tokens=4))
    assert len(good.token_ids) >= 1


def test_bad_request_over_http_generate_is_reported(served):
    server, _, _ = served
    with pytest.raises(RequestError, match="top_p"):
        http_generate(server.url, request_inputs("x", max_tokens=4, top_p=2.0, stream=False))


def _metric(server, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.ports.metrics}/metrics").read().decode()
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name)]
    return sum(values)


def test_client_that_disconnects_mid_stream_frees_its_slot(served):
    import tritonclient.grpc as grpcclient

    server, _, _ = served
    client = grpcclient.InferenceServerClient(server.grpc_url)
    first = threading.Event()
    client.start_stream(callback=lambda result, error: first.set())
    inputs = request_inputs("def main():\n", max_tokens=400, temperature=1.0, seed=5, ignore_eos=True)
    from dflash_trt.triton.client import _grpc_inputs

    client.async_stream_infer("dflash", _grpc_inputs(grpcclient, inputs))
    assert first.wait(60)
    deadline = time.time() + 10
    while _metric(server, "dflash_requests_running") < 1 and time.time() < deadline:
        time.sleep(0.05)
    assert _metric(server, "dflash_requests_running") >= 1
    client.stop_stream(cancel_requests=True)
    client.close()
    deadline = time.time() + 30
    while _metric(server, "dflash_requests_running") > 0 and time.time() < deadline:
        time.sleep(0.2)
    assert _metric(server, "dflash_requests_running") == 0
    assert len(grpc_generate(server.grpc_url, request_inputs("y = 2\n", max_tokens=4)).token_ids) >= 1


def test_metrics_report_acceptance_and_step_times(served):
    server, _, _ = served
    grpc_generate(server.grpc_url, request_inputs(PROMPTS[0], max_tokens=32))
    deadline = time.time() + 10  # metric updates go through the emitter thread: the last step's may trail the reply
    while _metric(server, "dflash_generated_tokens_total") < 32 and time.time() < deadline:
        time.sleep(0.1)
    assert _metric(server, "dflash_generated_tokens_total") >= 32
    assert _metric(server, "dflash_acceptance_length_count") >= 1
    assert _metric(server, "dflash_verify_step_seconds_count") >= 1
    assert _metric(server, "dflash_draft_step_seconds_sum") > 0
    # the width policy's choices: one observation per decode step, a greedy request alone drafts (full blocks)
    count, total = 'dflash_verify_width_count{model="dflash"}', 'dflash_verify_width_sum{model="dflash"}'
    steps, verified = _metric(server, count), _metric(server, total)
    assert steps >= 1 and verified / steps > 1


def test_speculative_decoding_counters_follow_vllms_names(served):
    """dflash_spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens / _per_pos{position}, as
    vLLM's vllm:spec_decode_* (a counter per draft position: the shares of the acceptance curve)."""
    server, _, manifest = served
    names = ("dflash_spec_decode_num_drafts{", "dflash_spec_decode_num_draft_tokens{",
             "dflash_spec_decode_num_accepted_tokens{", 'dflash_spec_decode_num_accepted_tokens_per_pos{model="dflash",position="1"}')
    before = {n: _metric(server, n) for n in names}
    result = grpc_generate(server.grpc_url, request_inputs(PROMPTS[1], max_tokens=48, ignore_eos=True))
    time.sleep(0.5)  # metric updates go through the emitter thread
    delta = {n: _metric(server, n) - before[n] for n in names}
    steps = len(result.acceptance_lengths)
    assert steps - 1 <= delta[names[0]] <= steps  # the last step may be cut by max_tokens before it drafts
    assert delta[names[1]] >= delta[names[0]]  # at least one draft per drafted step
    kept_drafts = sum(result.acceptance_lengths) - steps
    assert kept_drafts <= delta[names[2]] <= delta[names[1]]  # stops may drop accepted drafts, never add
    assert 0 < delta[names[3]] <= delta[names[0]]  # position 1 accepted at most once per step


def test_a_repeated_prefix_is_restored_and_counted(served):
    """A prompt that starts with a finished request's sequence: the server restores its cached blocks (the
    `cached_tokens` output), decodes the tokens of local AR all the same, and counts queries, hits, bytes held
    and the warm requests' acceptance on the metrics port."""
    server, pair, _ = served
    prefix = "".join(PROMPTS) * 3  # several blocks of 16 tokens
    names = ("dflash_prefix_cache_queries{", "dflash_prefix_cache_hits{",
             'dflash_verify_steps_by_prefix{model="dflash",prefix="warm"}')
    before = {n: _metric(server, n) for n in names}
    first = grpc_generate(server.grpc_url, request_inputs(prefix, max_tokens=24, ignore_eos=True))
    inputs = request_inputs(prefix + pair.tokenizer.decode(first.token_ids), max_tokens=24, ignore_eos=True)
    again = grpc_generate(server.grpc_url, inputs)
    assert again.cached_tokens >= 16 * (len(pair.tokenizer.encode(prefix)) // 16 - 1)
    assert again.token_ids == expected_tokens(pair, [inputs])[0]
    deadline = time.time() + 10
    while time.time() < deadline and _metric(server, names[2]) == before[names[2]]:
        time.sleep(0.1)  # metric updates go through the emitter thread
    delta = {n: _metric(server, n) - before[n] for n in names}
    assert delta[names[1]] >= again.cached_tokens and delta[names[0]] >= delta[names[1]]
    assert delta[names[2]] >= len(again.acceptance_lengths) and _metric(server, "dflash_prefix_cache_usage_bytes{") > 0


def test_refused_requests_count_as_failures_and_finished_ones_by_reason(served):
    """Triton counts a decoupled model's error response as a success; dflash_request_failure_total does not."""
    server, _, _ = served
    refused = 'dflash_request_failure_total{model="dflash",reason="refused"}'
    length = 'dflash_request_success_total{finished_reason="length",model="dflash"}'
    before = {n: _metric(server, n) for n in (refused, length)}
    with pytest.raises(RequestError, match="top_p"):
        grpc_generate(server.grpc_url, request_inputs("x", max_tokens=4, top_p=2.0))
    grpc_generate(server.grpc_url, request_inputs(PROMPTS[0], max_tokens=6, ignore_eos=True))
    deadline = time.time() + 10
    while time.time() < deadline and (_metric(server, refused) - before[refused] < 1
                                      or _metric(server, length) - before[length] < 1):
        time.sleep(0.1)
    assert _metric(server, refused) - before[refused] == 1
    assert _metric(server, length) - before[length] == 1


def test_stop_words_cut_text_and_stream_never_takes_text_back(served):
    server, pair, _ = served
    base = grpc_generate(server.grpc_url, request_inputs(PROMPTS[0], max_tokens=40))
    assert len(base.text) > 10
    stop = base.text[6:9]
    pieces = []
    result = grpc_generate(server.grpc_url, request_inputs(PROMPTS[0], max_tokens=40, stop_words=(stop,)),
                           on_text=pieces.append)
    assert result.finish_reason == "stop"
    assert result.text == base.text[: base.text.index(stop)]
    assert "".join(pieces) == result.text
    assert json.dumps(result.text)  # valid text


def test_served_bench_sweeps_both_models_and_writes_schema_and_plots(served, tmp_path):
    """`dflash-trt bench --url`: one run, dflash and dflash_ar side by side at each concurrency."""
    from click.testing import CliRunner
    from plot_checks import png_ok

    from dflash_trt.cli import cli

    server, _, _ = served
    out = tmp_path / "bench"
    result = CliRunner().invoke(cli, ["bench", "--url", server.grpc_url, "--concurrency", "1,2", "--num-prompts", "4",
                                      "--max-new-tokens", "16", "--temperature", "0,1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "T 1, concurrency 2: DFlash / autoregressive throughput" in result.output
    data = json.loads((out / "results.json").read_text())
    assert data["mode"] == "served" and data["schema_version"] == 1
    assert {p["temperature"] for p in data["points"]} == {0.0, 1.0}
    points = {(p["model"], p["concurrency"]): p for p in data["points"] if p["temperature"] == 0}
    assert set(points) == {(m, c) for m in ("dflash", "dflash_ar") for c in (1, 2)}
    for (model, _), p in points.items():
        assert p["requests"] == 4 and p["output_tokens"] == 4 * 16 and p["output_tokens_per_s"] > 0
        assert p["ttft_mean_s"] > 0 and p["tpot_mean_s"] > 0
        assert (p["mean_acceptance_length"] > 1) == (model == "dflash")  # the shipped pair accepts drafts
        assert (len(p["per_position_acceptance"]) > 0) == (model == "dflash")
    assert data["dflash_scaling_vs_c1"]["1"] == 1.0
    png_ok(out / "pareto.png")
    png_ok(out / "acceptance_histogram.png")


def test_served_bench_rounds_alternate_the_models_and_pool_each_point(served, tmp_path):
    """`bench --url --rounds 3`: each point sends its requests three times per model, DFlash and AR taking
    turns first (A B, B A, A B), and pools them: three times the requests and tokens in one point each."""
    from click.testing import CliRunner

    from dflash_trt.bench.served import round_orders
    from dflash_trt.cli import cli

    assert round_orders(("dflash", "dflash_ar"), 3) == [("dflash", "dflash_ar"), ("dflash_ar", "dflash"),
                                                        ("dflash", "dflash_ar")]
    server, _, _ = served
    out = tmp_path / "rounds"
    result = CliRunner().invoke(cli, ["bench", "--url", server.grpc_url, "--concurrency", "1", "--num-prompts", "2",
                                      "--max-new-tokens", "8", "--rounds", "3", "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads((out / "results.json").read_text())
    assert data["rounds"] == 3 and sorted(p["model"] for p in data["points"]) == ["dflash", "dflash_ar"]
    for p in data["points"]:
        assert p["requests"] == 2 * 3 and p["output_tokens"] == 2 * 3 * 8 and p["wall_s"] > 0


def test_served_bench_by_context_length_bypasses_the_prefix_cache(served, tmp_path):
    """`bench --url --context-lengths`: both models at each prompt length, token ids sent as cut; the sweep's
    repeated prompts (two rounds) never hit the prefix cache, so each length's prompts are prefilled every time."""
    from click.testing import CliRunner
    from plot_checks import png_ok

    from dflash_trt.cli import cli

    server, _, _ = served
    hits = "dflash_prefix_cache_hits{"
    before = _metric(server, hits)
    out = tmp_path / "lengths"
    result = CliRunner().invoke(cli, ["bench", "--url", server.grpc_url, "--context-lengths", "64,160", "--rounds", "2",
                                      "--concurrency", "1", "--num-prompts", "2", "--max-new-tokens", "8",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "concurrency 1, 160-token prompts: DFlash / autoregressive throughput" in result.output
    data = json.loads((out / "results.json").read_text())
    assert data["context_lengths"] == [64, 160]
    assert sorted((p["model"], p["context_length"]) for p in data["points"]) == \
        [(m, n) for m in ("dflash", "dflash_ar") for n in (64, 160)]
    assert all(p["requests"] == 2 * 2 and p["output_tokens"] == 2 * 2 * 8 for p in data["points"])
    time.sleep(0.5)  # metric updates go through the emitter thread
    assert _metric(server, hits) == before
    png_ok(out / "context_lengths.png")


def test_served_bench_takes_text_prompts(served, tmp_path):
    """`bench --url --prompts FILE` with text lines: the server tokenizes them (no tokenizer in served mode)."""
    from click.testing import CliRunner

    from dflash_trt.cli import cli

    server, _, _ = served
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"text": "def main():\n"}) + "\n" + json.dumps({"text": "import sys\n"}) + "\n")
    result = CliRunner().invoke(cli, ["bench", "--url", server.grpc_url, "--prompts", str(prompts), "--concurrency", "1",
                                      "--num-prompts", "2", "--max-new-tokens", "8", "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    points = json.loads((tmp_path / "b" / "results.json").read_text())["points"]
    assert all(p["output_tokens"] == 2 * 8 for p in points)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{\"txt\": 1}\n")
    result = CliRunner().invoke(cli, ["bench", "--url", server.grpc_url, "--prompts", str(bad), "--concurrency", "1"])
    assert result.exit_code == 1 and "bad.jsonl:1" in result.output and "Traceback" not in result.output
