"""The HTTP front's guards without a server: JSON depth, strict generate fields, the body limit."""

import asyncio
import json

import numpy as np
import pytest

from dflash_trt.errors import RequestError
from dflash_trt.triton.front import BodyGuard, FrontLimits, json_problem
from dflash_trt.triton.http_inputs import FIELDS, generate_inputs
from dflash_trt.triton.protocol import INPUTS, INTERNAL_INPUTS


def test_every_protocol_input_has_a_strict_field():
    public = [t for t in INPUTS if t[0] not in INTERNAL_INPUTS]
    assert list(FIELDS) == [name for name, _, _ in public]
    assert {name: FIELDS[name][2] for name in FIELDS} == {name: dtype.removeprefix("TYPE_").replace("STRING", "BYTES")
                                                          for name, dtype, _ in public}


@pytest.mark.parametrize("raw,problem", [
    (b'{"a": 1}', None),
    (b"[" * 32 + b"]" * 32, None),
    (b"[" * 33 + b"]" * 33, "nested deeper than 32"),
    (b"[" * 300_000, "nested deeper than 32"),  # what crashes tritonserver 2.51's parser
    (b'{"a": ' * 40 + b"1" + b"}" * 40, "nested deeper than 32"),
    (b'{"a": [1, 2', "not valid JSON"),
])
def test_json_problem(raw, problem):
    found = json_problem(raw, 32)
    assert (found is None) if problem is None else (problem in found)


@pytest.mark.parametrize("body,fragment", [
    ({"text_input": "x", "max_token": 4}, "unknown field 'max_token'"),
    ({"text_input": "x", "max_tokens": 4294967300}, "field 'max_tokens': 4294967300 is outside 1..2147483647"),
    ({"text_input": "x", "max_tokens": 0}, "field 'max_tokens': 0 is outside"),
    ({"text_input": "x", "max_tokens": 4.0}, "field 'max_tokens': expected an integer"),
    ({"text_input": "x", "max_tokens": True}, "field 'max_tokens': expected an integer"),
    ({"text_input": "x", "seed": -1}, "field 'seed': -1 is outside 0..18446744073709551615"),
    ({"text_input": "x", "seed": 2**64}, "field 'seed'"),
    ({"text_input": "x", "stream": 1}, "field 'stream': expected true or false"),
    ({"text_input": "x", "temperature": "hot"}, "field 'temperature': expected a finite number"),
    ({"text_input": 5}, "field 'text_input': expected a string"),
    ({"input_ids": [1, -2]}, "field 'input_ids': -2 is outside"),
    ({"text_input": "x", "stop_words": ["a", 3]}, "field 'stop_words'"),
    ({"text_input": "\ud800"}, "field 'text_input': not encodable as UTF-8"),
    ([1, 2], "must be a JSON object"),
])
def test_generate_fields_are_read_strictly(body, fragment):
    with pytest.raises(RequestError, match=fragment.replace("(", r"\(").replace(".", r"\.")):
        generate_inputs(body)


def test_generate_fields_keep_their_types():
    arrays = generate_inputs({"text_input": "hi", "max_tokens": 7, "seed": 2**64 - 1, "temperature": 1,
                              "stream": True, "stop_words": "x", "input_ids": [3, 4], "id": "r1"})
    assert arrays["seed"].dtype == np.uint64 and int(arrays["seed"][0]) == 2**64 - 1
    assert arrays["max_tokens"].dtype == np.int32 and arrays["temperature"].dtype == np.float32
    assert arrays["text_input"].tolist() == [b"hi"] and arrays["stop_words"].tolist() == [b"x"]
    assert arrays["input_ids"].tolist() == [3, 4] and "id" not in arrays


def _call(body: bytes, headers=()):
    """Drive the ASGI guard with one request; returns (status, body) of what it sent, or what the app saw."""
    seen, sent = {}, []

    async def app(scope, receive, send):
        seen["body"] = (await receive())["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    chunks = [body[i : i + 1000] for i in range(0, len(body), 1000)] or [b""]
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "headers": [(b"content-length", str(len(body)).encode()), *headers]}
    asyncio.run(BodyGuard(app, FrontLimits(max_body_bytes=5000, max_json_depth=8))(scope, receive, send))
    return sent[0]["status"], sent[1]["body"], seen.get("body")


def test_body_guard_limits_size_and_depth_before_the_app():
    assert _call(b'{"a": [1]}')[::2] == (200, b'{"a": [1]}')
    status, body, seen = _call(b"x" * 6000)
    assert status == 413 and seen is None and b"larger than 5000 bytes" in body
    status, body, seen = _call(b"[" * 9 + b"]" * 9)
    assert status == 400 and seen is None and json.loads(body)["error"] == "JSON nested deeper than 8 levels"
    binary = b'{"inputs": []}' + b"\x00\xff" * 10  # binary-tensor extension: only the header is JSON
    assert _call(binary, [(b"inference-header-content-length", b"14")])[0] == 200
    assert _call(binary, [(b"inference-header-content-length", b"99")])[0] == 400


def test_an_unreachable_server_is_a_503_not_a_hang():
    import urllib.error
    import urllib.request

    from dflash_trt.triton.front_app import Front, make_app
    from dflash_trt.triton.server import free_port

    dead_http, dead_grpc, port = free_port(), free_port(), free_port()
    front = Front(make_app(f"127.0.0.1:{dead_http}", f"127.0.0.1:{dead_grpc}", frozenset({"dflash"})),
                  "127.0.0.1", port).start()
    try:
        for path, body in (("/v2/health/ready", None), ("/v2/models/dflash/generate", b'{"text_input": "x"}')):
            request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body)
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(request, timeout=30)
            assert err.value.code == 503 and "not reachable" in json.loads(err.value.read())["error"]
    finally:
        front.stop()
