"""The public HTTP port of `dflash-trt serve`: a guarded ASGI front before Triton's own HTTP server.

Why (tritonserver 2.51's behaviour, docs/reliability.md): deeply nested JSON crashes the server in
its JSON parser; out-of-range integers wrap and misspelled fields are ignored; a
non-streaming `/generate` whose client disconnects runs to the end. In front of it:
- every body is bounded (`FrontLimits.max_body_bytes`, 413) and a JSON body (or the JSON header of a
  binary-tensor request) must parse within `max_json_depth` levels (400) before it is forwarded;
- `/v2/models/<m>/generate` and `generate_stream` of the dflash models are served here: the body is
  read strictly (triton/http_inputs.py) and sent over a gRPC stream, which is cancelled when the
  client goes away (streaming or not); responses keep Triton's JSON / server-sent-event format and
  its `{"error": ...}` bodies, with 400 for a refused request and 503 while the server is restarting;
- everything else under the port is passed through to Triton's HTTP server, which listens only on
  a private loopback port.
gRPC and the metrics port stay Triton's own (gRPC has no message-size flag in 2.51; see the docs).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass

import numpy as np

from dflash_trt.triton.http_inputs import ALL_FIELDS

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "host",
               "proxy-authorization", "proxy-authenticate", "content-length"}


@dataclass(frozen=True)
class FrontLimits:
    max_body_bytes: int = 8 << 20
    max_json_depth: int = 32


JSON_BODY = "dflash_json_body"  # the guard's parsed body, in the ASGI scope's state (parsed once)


def checked_json(raw: bytes, max_depth: int):
    """(value, None), or (None, why `raw` must not reach Triton's JSON parser: invalid, or nested
    deeper than max_depth)."""
    try:
        value = json.loads(raw)
    except RecursionError:
        return None, f"JSON nested deeper than {max_depth} levels"
    except ValueError as exc:
        return None, f"not valid JSON ({exc})"
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            return None, f"JSON nested deeper than {max_depth} levels"
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return value, None


def json_problem(raw: bytes, max_depth: int) -> str | None:
    """Why `raw` must not reach Triton's JSON parser, or None."""
    return checked_json(raw, max_depth)[1]


class BodyGuard:
    """ASGI middleware: reads each request body within the size limit and checks its JSON before the
    app sees it (then replays it; later receives are the client's, e.g. its disconnect)."""

    def __init__(self, app, limits: FrontLimits):
        self.app, self.limits = app, limits

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        openai = scope.get("path", "").startswith("/v1/")  # OpenAI's error shape on its endpoints
        declared = headers.get("content-length", "0")
        too_large = f"the body is larger than {self.limits.max_body_bytes} bytes"
        if not declared.isdigit():
            return await _error(send, 400, "Content-Length is not a number", openai)
        if int(declared) > self.limits.max_body_bytes:
            return await _error(send, 413, too_large, openai) if await _drain(receive, int(declared)) else None
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            more = message.get("more_body", False)
            if len(body) > self.limits.max_body_bytes:
                return await _error(send, 413, too_large, openai) if not more or await _drain(receive, 0) else None
        problem = self._problem(body, headers, scope)
        if problem:
            return await _error(send, 400, problem, openai)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _problem(self, body: bytes, headers: dict, scope) -> str | None:
        header_length = headers.get("inference-header-content-length")
        if header_length is not None:  # binary tensor extension: only the first N bytes are JSON
            if not header_length.isdigit() or int(header_length) > len(body):
                return "Inference-Header-Content-Length is not a length within the body"
            body = body[: int(header_length)]
        if not body.strip():
            return None
        value, problem = checked_json(body, self.limits.max_json_depth)
        if header_length is None:  # the whole body is JSON: the app reads it from here, not again
            scope.setdefault("state", {})[JSON_BODY] = value
        return problem


DRAIN_BYTES = 64 << 20  # a refused body up to this size is read and dropped, so its client reads the 413


async def _drain(receive, declared: int) -> bool:
    """Read and drop the rest of a refused body (no memory kept); False if the client left or the
    body is beyond DRAIN_BYTES (then the connection just closes)."""
    if declared > DRAIN_BYTES:
        return False
    seen = 0
    while seen <= DRAIN_BYTES:
        message = await receive()
        if message["type"] == "http.disconnect":
            return False
        seen += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


async def _error(send, status: int, message: str, openai: bool = False) -> None:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None} if openai else message
    payload = json.dumps({"error": error}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def output_value(result, name: str):
    """One output of a gRPC response: a one-element tensor as a scalar, strings decoded; None if absent."""
    array = result.as_numpy(name)
    if array is None:
        return None
    values = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in array.reshape(-1).tolist()]
    return values[0] if len(values) == 1 else values


def output_json(result, model: str) -> dict:
    """One response as Triton's generate endpoint writes it: one-element tensors as scalars."""
    out = {"model_name": model, "model_version": "1"}
    for output in result.get_response().outputs:
        out[output.name] = output_value(result, output.name)
    return out


def _infer_inputs(grpcclient, arrays: dict[str, np.ndarray]) -> list:
    tensors = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), ALL_FIELDS[name][2])
        tensor.set_data_from_numpy(array)
        tensors.append(tensor)
    return tensors


class GrpcGenerate:
    """Generate requests over one shared gRPC channel to Triton (made inside the server's event loop)."""

    def __init__(self, grpc_url: str):
        self.grpc_url, self.client = grpc_url, None

    def responses(self, model: str, arrays: dict[str, np.ndarray]) -> "Answer":
        """One request's stream: its responses and the two ways to end it (`Answer`)."""
        import tritonclient.grpc.aio as grpcclient

        if self.client is None:
            self.client = grpcclient.InferenceServerClient(self.grpc_url)
        request = {"model_name": model, "inputs": _infer_inputs(grpcclient, arrays), "request_id": uuid.uuid4().hex}
        answered = asyncio.Event()

        async def one():
            yield request
            await answered.wait()  # keep our side of the stream open until the answer is complete

        iterator = self.client.stream_infer(one())
        return Answer(iterator, answered.set, iterator.cancel)


class Answer:
    """A generate request's gRPC stream: `iterator` yields (result | None, error | None); `close()` ends our
    side once the final response is in (the server then ends the stream itself); `cancel()` aborts it (the
    client left, or the answer failed). Why both: tritonserver 2.51 keeps memory of every stream its client
    cancels after the final response, and next to none when our side is closed instead (docs/reliability.md),
    so a front that cancelled every finished answer grew the server's heap with each request."""

    def __init__(self, iterator, close, cancel):
        self.iterator, self.close, self.cancel = iterator, close, cancel


def is_final(result, error) -> bool:
    if error is not None:
        return True
    reason = result.as_numpy("finish_reason")
    return reason is not None and reason.size > 0 and bool(reason.reshape(-1)[0])


def unavailable(exc: BaseException) -> bool:
    """Whether a gRPC failure means the server is down (restarting) rather than a refused request."""
    text = str(exc)
    return any(s in text for s in ("UNAVAILABLE", "failed to connect", "Connection refused", "Socket closed"))


def refusal(exc: BaseException) -> tuple[int, str]:
    message = exc.message() if hasattr(exc, "message") and callable(exc.message) else str(exc)
    if unavailable(exc):
        return 503, f"tritonserver is not reachable (restarting?): {message}"
    return (404 if "unknown model" in message.lower() or "not found" in message.lower() else 400), message


