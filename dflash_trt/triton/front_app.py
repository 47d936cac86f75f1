"""The front's routes and its server (triton/front.py has the why and the guards).

    POST /v2/models/<dflash model>/generate          strict body -> gRPC stream -> one JSON response
    POST /v2/models/<dflash model>/generate_stream   strict body -> gRPC stream -> server-sent events
    GET /v1/models, POST /v1/completions, /v1/chat/completions   OpenAI's API (triton/openai_api.py)
    anything else                                    passed through to Triton's private HTTP port

`Front` runs the app with uvicorn in a thread beside the supervisor; it binds 127.0.0.1 unless told.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

from dflash_trt.errors import RequestError
from dflash_trt.triton.front import (
    HOP_HEADERS,
    JSON_BODY,
    BodyGuard,
    FrontLimits,
    GrpcGenerate,
    is_final,
    output_json,
    output_value,
    refusal,
)
from dflash_trt.triton.http_inputs import ENSEMBLE_FIELDS, generate_inputs
from dflash_trt.triton.openai_api import OpenAIError, Reply, finish_reason, model_inputs


def _sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _json(payload: dict, status: int = 200):
    """A JSON response written as ASCII (a message may quote a client's lone surrogate)."""
    from starlette.responses import Response

    return Response(json.dumps(payload, separators=(",", ":")), status, media_type="application/json")


def _output_text(result) -> str:
    return output_value(result, "text_output") or ""


async def _client_gone(request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def make_app(triton_http: str, triton_grpc: str, models: frozenset[str], limits: FrontLimits = FrontLimits(),
             ensembles: frozenset[str] = frozenset()):
    """The ASGI app: `models` are the dflash models whose generate endpoints (and OpenAI ids) the front
    serves itself; `ensembles` the TensorRT-LLM-named adapters (generate only, their own fields)."""
    import httpx
    from starlette.applications import Starlette
    from starlette.background import BackgroundTask
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    grpc, http = GrpcGenerate(triton_grpc), httpx.AsyncClient(base_url=f"http://{triton_http}", timeout=None)

    async def passthrough(request):
        query = f"?{request.url.query}" if request.url.query else ""
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_HEADERS]
        upstream_request = http.build_request(request.method, request.url.path + query, headers=headers,
                                              content=await request.body())
        try:
            upstream = await http.send(upstream_request, stream=True)
        except httpx.TransportError as exc:
            return _json({"error": f"tritonserver is not reachable (restarting?): {exc}"}, 503)
        kept = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS}
        return StreamingResponse(upstream.aiter_raw(), status_code=upstream.status_code, headers=kept,
                                 background=BackgroundTask(upstream.aclose))

    async def start(request):
        """(model, Answer), or a Response: refused, or another model's (passed through)."""
        model = request.path_params["model"]
        if model not in models and model not in ensembles:
            return await passthrough(request)
        try:
            state = request.scope.get("state", {})  # the guard parsed the body (absent: it was empty)
            body = state[JSON_BODY] if JSON_BODY in state else json.loads(await request.body() or b"null")
            arrays = generate_inputs(body, ENSEMBLE_FIELDS, batched=True) if model in ensembles \
                else generate_inputs(body)
        except RequestError as exc:
            return _json({"error": exc.format_message()}, 400)
        return model, grpc.responses(model, arrays)

    async def until_final(iterator, model: str, stop_after_first: bool):
        """The first response (stop_after_first) or the final one, as (result, None) or (None, Response)."""
        while True:
            try:
                result, error = await iterator.__anext__()
            except Exception as exc:  # noqa: BLE001 - gRPC errors: unreachable, unknown model, gone mid-answer
                status, message = refusal(exc)
                return None, _json({"error": message}, status)
            if error is not None:
                return None, _json({"error": error.message()}, 400)
            if stop_after_first or is_final(result, None):
                return result, None

    async def raced(request, coro, answer):
        """`coro`'s value, or None when the client disconnects first (the request is then cancelled)."""
        waiting, gone = asyncio.ensure_future(coro), asyncio.ensure_future(_client_gone(request))
        await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not waiting.done():
            waiting.cancel()
            answer.cancel()
            return None
        return waiting.result()

    def end(answer, complete: bool) -> None:
        """Close a complete answer's stream (the server ends it), cancel any other (see `Answer`)."""
        (answer.close if complete else answer.cancel)()

    async def generate(request):
        started = await start(request)
        if isinstance(started, Response):
            return started
        model, answer = started
        outcome = await raced(request, until_final(answer.iterator, model, stop_after_first=False), answer)
        if outcome is None:
            return Response(status_code=499)  # the client left
        result, refused = outcome
        end(answer, complete=refused is None)
        return refused or _json(output_json(result, model))

    async def generate_stream(request):
        started = await start(request)
        if isinstance(started, Response):
            return started
        model, answer = started
        outcome = await raced(request, until_final(answer.iterator, model, stop_after_first=True), answer)
        if outcome is None or outcome[1] is not None:  # gone, or refused before any output: a plain status
            answer.cancel()
            return outcome[1] if outcome else Response(status_code=499)
        first = outcome[0]

        async def events():
            complete = False
            try:
                current = first
                yield _sse(output_json(current, model))
                while not is_final(current, None):
                    current, error = await answer.iterator.__anext__()
                    if error is not None:
                        yield _sse({"error": error.message()})
                        return
                    yield _sse(output_json(current, model))
                complete = True
            except Exception as exc:  # noqa: BLE001 - the server went away mid-stream
                yield _sse({"error": refusal(exc)[1]})
            finally:
                end(answer, complete)  # cancelled when the client disconnects (Starlette cancels this generator)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def openai_models(request):
        created = int(time.time())
        return _json({"object": "list", "data": [{"id": m, "object": "model", "created": created,
                                                  "owned_by": "dflash-trt"} for m in sorted(models)]})

    async def openai_call(request, chat: bool):
        state = request.scope.get("state", {})
        try:
            body = state[JSON_BODY] if JSON_BODY in state else json.loads(await request.body() or b"null")
            model, arrays, stream, include_usage = model_inputs(body, chat, models)
        except OpenAIError as exc:
            return _json(exc.body(), exc.status)
        reply = Reply(model, chat)
        answer = grpc.responses(model, arrays)
        outcome = await raced(request, until_final(answer.iterator, model, stop_after_first=True), answer)
        if outcome is None:
            return Response(status_code=499)
        first, refused = outcome
        if refused is not None:  # Triton refused it (the model's own checks): OpenAI's shape, same status
            answer.cancel()
            message = json.loads(refused.body)["error"]
            return _json(OpenAIError(message, refused.status_code).body(), refused.status_code)
        if not stream:
            async def rest() -> tuple:
                text, current = [], first
                while True:
                    text.append(_output_text(current))
                    if is_final(current, None):
                        return "".join(text), current, None
                    current, error = await answer.iterator.__anext__()
                    if error is not None:
                        return None, None, error.message()
            done = await raced(request, rest(), answer)
            if done is None:
                return Response(status_code=499)
            text, final, error = done
            end(answer, complete=error is None)
            if error is not None:
                return _json(OpenAIError(error).body(), 400)
            return _json(reply.full(text, final))

        async def events():
            complete = False
            try:
                current, opened = first, False
                while True:
                    delta = _output_text(current)
                    if chat and not opened:
                        yield _sse(reply.chunk(delta, first=True))
                        opened = True
                    elif delta:
                        yield _sse(reply.chunk(delta))
                    if is_final(current, None):
                        yield _sse(reply.chunk(None if chat else "", finish_reason(current)))
                        if include_usage:
                            yield _sse(reply.usage_chunk(current))
                        complete = True
                        yield b"data: [DONE]\n\n"
                        return
                    current, error = await answer.iterator.__anext__()
                    if error is not None:
                        yield _sse(OpenAIError(error.message()).body())
                        return
            except Exception as exc:  # noqa: BLE001 - the server went away mid-stream
                yield _sse(OpenAIError(refusal(exc)[1], 503).body())
            finally:
                end(answer, complete)

        return StreamingResponse(events(), media_type="text/event-stream")

    async def completions(request):
        return await openai_call(request, chat=False)

    async def chat_completions(request):
        return await openai_call(request, chat=True)

    methods = ["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]
    routes = [
        Route("/v1/models", openai_models, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v2/models/{model}/generate", generate, methods=["POST"]),
        Route("/v2/models/{model}/generate_stream", generate_stream, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/generate", generate, methods=["POST"]),
        Route("/v2/models/{model}/versions/{version}/generate_stream", generate_stream, methods=["POST"]),
        Route("/{path:path}", passthrough, methods=methods),
    ]
    return BodyGuard(Starlette(routes=routes), limits)


class Front:
    """uvicorn serving the front app in a thread; `start()` returns once it listens."""

    def __init__(self, app, host: str, port: int):
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off",
                                timeout_graceful_shutdown=5)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="dflash-front", daemon=True)

    def start(self, timeout: float = 30.0) -> "Front":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the HTTP front did not start (is the port free?)")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
