"""The `ensemble` model: client code written for TensorRT-LLM's Triton backend, unmodified, against the
real tritonserver — tensors shaped [1, 1] over gRPC, TensorRT-LLM's JSON over the HTTP generate
endpoint, `random_seed`, `bad_words`, `end_id`, `exclude_input_in_output`, the llmapi statistics."""

import json
import urllib.error
import urllib.request

import numpy as np
import pytest

pytestmark = pytest.mark.integration  # every test here talks to the `served` tritonserver

grpcclient = pytest.importorskip("tritonclient.grpc")


def _local(pair, prompt: str, max_new: int, temperature=0.0, seed=0, top_k=0, top_p=1.0, bad_words=(), stops=None):
    from dflash_trt.decoding.autoregressive import autoregressive_generate
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.decoding.sampling import SamplingParams
    from dflash_trt.tokenizer import stop_token_ids

    ids = pair.tokenizer.encode(prompt, add_special_tokens=True)
    stops = stop_token_ids(pair.tokenizer, pair.target.config.eos_token_ids) if stops is None else stops
    words = tuple(tuple(pair.tokenizer.encode(w, add_special_tokens=False)) for w in bad_words)
    request = Request(tuple(ids), SamplingParams(temperature, top_k, top_p, seed), StopCriteria(max_new, stops), words)
    return autoregressive_generate(pair.target, [request])[0].tokens


def _trtllm_inputs(prompt: str, max_tokens: int, **extra) -> list:
    """What TensorRT-LLM's end_to_end_grpc_client sends: every tensor [1, 1] (bad/stop words [1, n])."""
    types = {np.object_: "BYTES", np.int32: "INT32", np.float32: "FP32", np.uint64: "UINT64", np.bool_: "BOOL"}
    arrays = {"text_input": np.array([[prompt.encode()]], dtype=np.object_),
              "max_tokens": np.array([[max_tokens]], dtype=np.int32)}
    for name, (value, dtype) in extra.items():
        arrays[name] = np.array([value if isinstance(value, list) else [value]], dtype=dtype)
    tensors = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), types[array.dtype.type])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


def _stream(server, inputs, model="ensemble"):
    """All responses of one request over a gRPC stream (the ensemble is decoupled, as TensorRT-LLM's is
    when streaming): [(result, error)]."""
    import queue

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer(model, inputs)
    responses = []
    while True:
        result, error = got.get(timeout=120)
        responses.append((result, error))
        if error is not None or result.as_numpy("finish_reason").reshape(-1)[0]:
            break
    client.stop_stream()
    return responses


def _text(result) -> str:
    return result.as_numpy("text_output").reshape(-1)[0].decode()


def test_grpc_batch_shaped_request_echoes_the_prompt_and_reports_llmapi_statistics(served):
    server, pair, _ = served
    prompt = "def fibonacci(n):\n    "
    [(result, error)] = _stream(server, _trtllm_inputs(prompt, 24))
    assert error is None
    tokens = _local(pair, prompt, 24)
    assert result.as_numpy("text_output").shape == (1, 1)
    assert _text(result) == prompt + pair.tokenizer.decode(tokens, skip_special_tokens=True)  # exclude_input false
    assert int(result.as_numpy("num_output_tokens")[0, 0]) == len(tokens)
    drafted, accepted = int(result.as_numpy("total_draft_tokens")[0, 0]), int(result.as_numpy("total_accepted_draft_tokens")[0, 0])
    assert drafted > accepted > 0
    assert float(result.as_numpy("acceptance_rate")[0, 0]) == pytest.approx(accepted / drafted)


def test_random_seed_bad_words_and_streaming_equal_local_decoding(served):
    server, pair, _ = served
    prompt = "import os\nimport "
    plain = pair.tokenizer.decode(_local(pair, prompt, 20), skip_special_tokens=True)
    banned = plain.split()[0]  # a word the unbanned answer writes
    tokens = _local(pair, prompt, 20, 0.8, seed=11, bad_words=[banned])
    responses = _stream(server, _trtllm_inputs(prompt, 20, temperature=(0.8, np.float32),
                                               random_seed=(11, np.uint64), bad_words=([banned.encode()], np.object_),
                                               stream=(True, np.bool_)))
    assert all(error is None for _, error in responses) and len(responses) > 1
    assert "".join(_text(r) for r, _ in responses) == pair.tokenizer.decode(tokens, skip_special_tokens=True)
    assert responses[-1][0].as_numpy("finish_reason")[0, 0].decode() in ("stop", "length")


def test_end_id_replaces_the_end_token(served):
    server, pair, _ = served
    prompt = "for i in range(10):\n"
    free = _local(pair, prompt, 30, stops=frozenset())
    end = free[5]
    [(result, _)] = _stream(server, _trtllm_inputs(prompt, 30, end_id=(end, np.int32), pad_id=(0, np.int32),
                                                   exclude_input_in_output=(True, np.bool_)))
    expected = free[: free.index(end) + 1]
    assert _text(result) == pair.tokenizer.decode(expected, skip_special_tokens=True)
    assert result.as_numpy("finish_reason")[0, 0].decode() == "stop"


def test_fields_the_model_does_not_honour_are_refused_by_name(served):
    server, _, _ = served
    [(_, error)] = _stream(server, _trtllm_inputs("x", 4, repetition_penalty=(1.2, np.float32)))
    assert "unexpected inference input 'repetition_penalty'" in error.message()
    responses = _stream(server, _trtllm_inputs("x", 4, seed=(1, np.uint64), random_seed=(1, np.uint64)))
    assert "either 'seed' or 'random_seed'" in responses[-1][1].message()


def _post(front, path, body):
    request = urllib.request.Request(f"http://{front}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_http_generate_with_tensorrt_llm_json(front, served):
    """The body of TensorRT-LLM's README (`bad_words: ""`, `stop_words: ""`), scalars or batch-shaped."""
    pair = served[1]
    prompt = "What is machine learning?"
    expected = prompt + pair.tokenizer.decode(_local(pair, prompt, 16), skip_special_tokens=True)
    for body in ({"text_input": prompt, "max_tokens": 16, "bad_words": "", "stop_words": ""},
                 {"text_input": [[prompt]], "max_tokens": [[16]], "bad_words": [[""]], "stop_words": [[""]]}):
        status, out = _post(front, "/v2/models/ensemble/generate", body)
        assert status == 200, out
        assert out["text_output"] == expected and out["model_name"] == "ensemble"
    status, out = _post(front, "/v2/models/ensemble/generate", {"text_input": prompt, "max_tokens": 4,
                                                               "beam_width": 2})
    assert status == 400 and "unknown field 'beam_width'" in out["error"]


def _cancelled_total(server) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.ports.metrics}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("dflash_request_success_total") and 'model="dflash"' in line \
                    and 'finished_reason="cancelled"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_cancelled_ensemble_request_cancels_its_dflash_request(served):
    """Triton 2.51's BLS cannot cancel: the adapter's cancel_request_id reaches the scheduler, which frees
    the slot after a step instead of decoding all 480 tokens."""
    import queue
    import time

    server = served[0]
    before = _cancelled_total(server)
    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    client.async_stream_infer("ensemble", _trtllm_inputs("def f(x):\n", 480, stream=(True, np.bool_),
                                                         end_id=(0, np.int32)))
    got.get(timeout=60)  # decoding has started
    client.stop_stream(cancel_requests=True)
    deadline = time.monotonic() + 30
    while _cancelled_total(server) == before:
        assert time.monotonic() < deadline, "the dflash request was not cancelled"
        time.sleep(0.2)
