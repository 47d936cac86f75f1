"""Hostile requests through the guarded HTTP front before a real tritonserver (the shipped pair).

Each case once took the server down, stalled it or silently did the wrong thing (docs/reliability.md);
through the front it is refused with a clear error and the server keeps serving."""

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from dflash_trt.triton.client import grpc_generate, http_generate, request_inputs

pytestmark = pytest.mark.integration


def _post(front: str, path: str, raw: bytes, timeout: float = 60) -> tuple[int, dict]:
    request = urllib.request.Request(f"http://{front}{path}", data=raw, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _still_serving(served, front) -> None:
    server = served[0]
    assert server.process.poll() is None
    assert http_generate(front, request_inputs("x = 1\n", max_tokens=4, stream=False)).token_ids
    assert grpc_generate(server.grpc_url, request_inputs("x = 1\n", max_tokens=4)).token_ids


@pytest.mark.parametrize("case,raw,status,fragment", [
    ("deep json", b'{"text_input": ' + b"[" * 150_000 + b"]" * 150_000 + b"}", 400, "nested deeper than"),
    ("huge body", json.dumps({"text_input": "a" * (9 << 20)}).encode(), 413, "larger than"),
    ("wrapping int", b'{"text_input": "x", "max_tokens": 4294967300}', 400, "outside 1..2147483647"),
    ("misspelled field", b'{"text_input": "x", "max_token": 4}', 400, "unknown field 'max_token'"),
    ("negative seed", b'{"text_input": "x", "seed": -1}', 400, "field 'seed'"),
    ("not json", b'{"text_input": "x"', 400, "not valid JSON"),
    ("model refusal", b'{"text_input": ""}', 400, "the prompt is empty"),
])
def test_hostile_generate_bodies_are_refused_and_the_server_keeps_serving(served, front, case, raw, status, fragment):
    for path in ("/v2/models/dflash/generate", "/v2/models/dflash/generate_stream"):
        got, body = _post(front, path, raw)
        assert (got, fragment in body["error"]) == (status, True), (case, path, body)
    _still_serving(served, front)


def test_other_endpoints_pass_through(served, front):
    with urllib.request.urlopen(f"http://{front}/v2/health/ready", timeout=10) as response:
        assert response.status == 200
    with urllib.request.urlopen(f"http://{front}/v2/models/dflash_ar", timeout=10) as response:
        assert json.loads(response.read())["name"] == "dflash_ar"
    status, body = _post(front, "/v2/models/nosuch/generate", b'{"text_input": "x"}')
    assert status in (400, 404) and "nosuch" in body["error"]


def _metric(server, name: str, model: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{server.ports.metrics}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and f'model="{model}"' in line)


@pytest.mark.parametrize("path", ["generate", "generate_stream"])
def test_a_client_that_disconnects_is_cancelled(served, front, path):
    """480 tokens asked for, ignore_eos: a request that ran to the end would add exactly 480."""
    server = served[0]
    before = _metric(server, "dflash_generated_tokens_total", "dflash_ar")
    body = json.dumps(request_inputs("def main():\n", max_tokens=480, ignore_eos=True,
                                     stream=path.endswith("stream"))).encode()
    host, port = front.split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"POST /v2/models/dflash_ar/{path} HTTP/1.1\r\n".encode() + b"Host: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        deadline = time.time() + 30
        while _metric(server, "dflash_requests_running", "dflash_ar") < 1 and time.time() < deadline:
            time.sleep(0.02)
    deadline = time.time() + 30
    while _metric(server, "dflash_requests_running", "dflash_ar") > 0 and time.time() < deadline:
        time.sleep(0.05)
    assert _metric(server, "dflash_requests_running", "dflash_ar") == 0
    assert _metric(server, "dflash_generated_tokens_total", "dflash_ar") - before < 480
    _still_serving(served, front)


def _ended_by(server, how: str) -> str:
    """How the front's stream to Triton ends after the final response when we `close` or `cancel` it:
    "ok" (the server ended it with OK) or the exception's name."""
    import asyncio

    from dflash_trt.triton.front import GrpcGenerate, is_final
    from dflash_trt.triton.http_inputs import generate_inputs

    async def run() -> str:
        answer = GrpcGenerate(server.grpc_url).responses("dflash_ar", generate_inputs(
            {"text_input": "x = 1\n", "max_tokens": 6, "ignore_eos": True, "stream": True}))
        while not is_final(*(await answer.iterator.__anext__())):
            pass
        getattr(answer, how)()
        try:
            await asyncio.wait_for(answer.iterator.__anext__(), timeout=30)
        except StopAsyncIteration:
            return "ok"
        except BaseException as exc:  # noqa: BLE001 - what a cancelled stream raises
            return type(exc).__name__
        return "another response"

    return asyncio.run(run())


def test_a_complete_answer_closes_its_stream_instead_of_cancelling_it(served):
    """Triton 2.51 keeps ~9.5 KB of every stream its client cancels after the final response (the front
    did that for every answer: the server's heap grew per request, docs/reliability.md); closing our side
    lets the server end the stream itself, with OK."""
    server = served[0]
    assert _ended_by(server, "close") == "ok"
    assert _ended_by(server, "cancel") != "ok"  # what the front still does when the client leaves
