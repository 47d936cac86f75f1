"""Clients for a served `dflash` model: gRPC streaming (tritonclient) and HTTP generate / generate_stream.

Both return the same `ServedResult`, so tests and `dflash-trt generate --url` compare them directly.
"""

from __future__ import annotations

import http.client
import json
import queue
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field

import numpy as np

from dflash_trt.errors import MissingDependencyError, RequestError

MODEL = "dflash"


@dataclass
class ServedResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = ""
    acceptance_lengths: list[int] = field(default_factory=list)
    mean_acceptance_length: float = 0.0
    cached_tokens: int = 0  # prompt tokens the server restored from its prefix cache
    prompt_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    responses: int = 0

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.total_s if self.total_s else 0.0


def request_inputs(prompt: str | None = None, input_ids: list[int] | None = None, max_tokens: int = 64,
                   temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                   stop_words: tuple[str, ...] = (), stream: bool = True, chat: bool = False,
                   ignore_eos: bool = False, prefix_cache: bool = True) -> dict:
    """The request as name -> value, shared by every transport."""
    inputs = {"max_tokens": max_tokens, "temperature": temperature, "top_p": top_p, "top_k": top_k,
              "seed": seed, "stream": stream}
    if input_ids is not None:
        inputs["input_ids"] = list(input_ids)
    else:
        inputs["text_input"] = prompt
    if stop_words:
        inputs["stop_words"] = list(stop_words)
    if chat:
        inputs["chat"] = True
    if ignore_eos:
        inputs["ignore_eos"] = True
    if not prefix_cache:
        inputs["prefix_cache"] = False
    return inputs


_GRPC_TYPES = {"max_tokens": ("INT32", np.int32), "temperature": ("FP32", np.float32), "top_p": ("FP32", np.float32),
               "top_k": ("INT32", np.int32), "seed": ("UINT64", np.uint64), "stream": ("BOOL", np.bool_),
               "chat": ("BOOL", np.bool_), "ignore_eos": ("BOOL", np.bool_), "prefix_cache": ("BOOL", np.bool_),
               "input_ids": ("INT32", np.int32), "text_input": ("BYTES", np.object_), "stop_words": ("BYTES", np.object_)}


def _grpc_inputs(grpcclient, inputs: dict) -> list:
    out = []
    for name, value in inputs.items():
        dtype, np_type = _GRPC_TYPES[name]
        values = value if isinstance(value, list) else [value]
        if np_type is np.object_:
            values = [v.encode("utf-8") if isinstance(v, str) else v for v in values]
        array = np.array(values, dtype=np_type)
        tensor = grpcclient.InferInput(name, list(array.shape), dtype)
        tensor.set_data_from_numpy(array)
        out.append(tensor)
    return out


def _absorb(result: ServedResult, get, stream: bool) -> None:
    """Fold one response's tensors into the result (streamed deltas or one full response)."""
    text, ids = get("text_output"), get("output_ids")
    if text is not None and len(text):
        chunk = text.reshape(-1)[0]
        result.text += chunk.decode("utf-8") if isinstance(chunk, bytes) else str(chunk)
    if ids is not None:
        result.token_ids += [int(t) for t in np.asarray(ids).reshape(-1)]
    reason = get("finish_reason")
    if reason is not None and len(reason) and reason.reshape(-1)[0]:
        r = reason.reshape(-1)[0]
        result.finish_reason = r.decode() if isinstance(r, bytes) else str(r)
        lengths = get("acceptance_lengths")
        result.acceptance_lengths = [int(x) for x in np.asarray(lengths).reshape(-1)] if lengths is not None else []
        result.mean_acceptance_length = float(np.asarray(get("mean_acceptance_length")).reshape(-1)[0])
        cached, prompt = get("cached_tokens"), get("num_prompt_tokens")
        result.cached_tokens = int(np.asarray(cached).reshape(-1)[0]) if cached is not None else 0
        result.prompt_tokens = int(np.asarray(prompt).reshape(-1)[0]) if prompt is not None else 0


def grpc_generate(url: str, inputs: dict, on_text=None, timeout: float = 300.0, model: str = MODEL) -> ServedResult:
    """One request over a gRPC stream; `on_text(delta)` sees text as it arrives."""
    try:
        import tritonclient.grpc as grpcclient
    except ImportError:
        raise MissingDependencyError("tritonclient is not installed: pip install 'dflash-trt[serve]'") from None
    from tritonclient.utils import InferenceServerException

    try:
        client = grpcclient.InferenceServerClient(url)
    except InferenceServerException as exc:
        raise RequestError(f"--url {url}: not a gRPC address ({exc.message()})") from None
    responses: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    result, t0 = ServedResult(), time.perf_counter()
    try:
        try:
            client.async_stream_infer(model, _grpc_inputs(grpcclient, inputs), request_id=uuid.uuid4().hex,
                                      enable_empty_final_response=True)
        except InferenceServerException:  # the stream died: the callback has the reason
            _, error = responses.get(timeout=5) if not responses.empty() else (None, None)
            raise RequestError(unreachable(url, "gRPC", error.message() if error is not None else "stream closed"))
        while True:
            try:
                response, error = responses.get(timeout=timeout)
            except queue.Empty:
                raise RequestError(f"{url}: no response within {timeout:.0f} s") from None
            if error is not None and _is_transport(error):
                raise RequestError(unreachable(url, "gRPC", error.message()))
            if error is not None:
                raise RequestError(f"server: {error.message() if hasattr(error, 'message') else error}")
            before = len(result.text)
            _absorb(result, response.as_numpy, inputs.get("stream", True))
            result.responses += 1
            if result.token_ids and not result.ttft_s:
                result.ttft_s = time.perf_counter() - t0
            if on_text and len(result.text) > before:
                on_text(result.text[before:])
            if response.get_response().parameters.get("triton_final_response").bool_param:
                break
    finally:
        client.stop_stream()
        client.close()
    result.total_s = time.perf_counter() - t0
    return result


def _is_transport(error) -> bool:
    status = str(getattr(error, "status", lambda: "")() or "")
    return "UNAVAILABLE" in status or "Connection refused" in error.message() or "Socket closed" in error.message()


def unreachable(url: str, protocol: str, detail: str) -> str:
    """One line for a server that is not there, or speaks the other protocol."""
    other = "--protocol http (the HTTP port, 8000)" if protocol == "gRPC" else "--protocol grpc (the gRPC port, 8001)"
    return (f"{url}: no Triton {protocol} server answers there ({detail.splitlines()[0][:160]}); is `dflash-trt serve` "
            f"running, and is this its {protocol} port? For the other port use {other}")


def _post(url: str, path: str, body: dict, timeout: float):
    request = urllib.request.Request(f"http://{url}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")
        raise RequestError(f"server: HTTP {exc.code}: {detail}") from None
    except (urllib.error.URLError, http.client.HTTPException, OSError) as exc:  # refused, reset, a gRPC port (HTTP/2)
        detail = str(getattr(exc, "reason", "")) or type(exc).__name__
        raise RequestError(unreachable(url, "HTTP", detail)) from None


def _json_get(payload: dict):
    return lambda name: None if name not in payload else np.array(
        payload[name] if isinstance(payload[name], list) else [payload[name]],
        dtype=object if isinstance(payload[name], str) or name in ("text_output", "finish_reason") else None)


def http_generate(url: str, inputs: dict, on_text=None, timeout: float = 300.0, model: str = MODEL) -> ServedResult:
    """KServe generate extension: `/generate` (one JSON) or `/generate_stream` (server-sent events)."""
    stream = bool(inputs.get("stream", False))
    path = f"/v2/models/{model}/generate" + ("_stream" if stream else "")
    result, t0 = ServedResult(), time.perf_counter()
    with _post(url, path, inputs, timeout) as response:
        lines = response if stream else [b"data: " + response.read()]
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            payload = json.loads(line[5:])
            if "error" in payload:  # errors can arrive inside a 200 response (check every event)
                raise RequestError(f"server: {payload['error']}")
            before = len(result.text)
            _absorb(result, _json_get(payload), stream)
            result.responses += 1
            if result.token_ids and not result.ttft_s:
                result.ttft_s = time.perf_counter() - t0
            if on_text and len(result.text) > before:
                on_text(result.text[before:])
    result.total_s = time.perf_counter() - t0
    return result
