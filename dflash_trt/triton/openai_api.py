"""OpenAI-compatible endpoints of the front: what `openai`, aiperf, lm-eval and guidellm speak.

    GET  /v1/models             the served dflash models (ids = Triton model names: dflash, dflash_ar)
    POST /v1/completions        prompt (a string, or token ids) -> text
    POST /v1/chat/completions   messages -> the tokenizer's chat template (in the model) -> text

Each request becomes the dflash model's inputs (the same strict fields as the KServe endpoints,
triton/http_inputs.py) and goes to Triton over the front's gRPC stream, so it is decoded, bounded and
cancelled exactly like any other request. OpenAI's fields and defaults: `max_tokens` (chat also
`max_completion_tokens`; completions default 16, chat the model's), `temperature` (default 1), `top_p`,
`seed`, `stop` (a string or up to 4), `stream` (server-sent events ending in `data: [DONE]`,
`stream_options.include_usage`), `n` = 1; extensions `top_k`, `ignore_eos`. Fields this server cannot honour
(n > 1, logprobs, echo, penalties, logit_bias, ...) and unknown fields are refused with OpenAI's error
shape, never silently dropped. `usage` counts prompt and completion tokens, and in
`prompt_tokens_details.cached_tokens` the prompt tokens restored from the prefix cache; `dflash` adds the
acceptance statistics (mean acceptance length, verify steps).
"""

from __future__ import annotations

import json
import math
import time
import uuid

from dflash_trt.errors import RequestError
from dflash_trt.triton.front import output_value
from dflash_trt.triton.http_inputs import generate_inputs

COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n", "user",
          "top_k", "ignore_eos", "presence_penalty", "frequency_penalty", "logprobs", "logit_bias"}
COMPLETION_FIELDS = COMMON | {"prompt", "echo", "best_of", "suffix"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "top_logprobs"}
# fields accepted only at the value that means "off"
OFF = {"n": (1,), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logprobs": (None, False, 0),
       "echo": (False,), "best_of": (1,), "suffix": (None, ""), "logit_bias": (None, {}), "top_logprobs": (None, 0)}


class OpenAIError(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.message, self.status, self.param, self.kind, self.code = message, status, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _number(body: dict, name: str, low: float, high: float):
    value = body[name]
    if type(value) not in (int, float) or not math.isfinite(value) or not low <= value <= high:
        raise OpenAIError(f"'{name}' must be a number in [{low}, {high}], got {json.dumps(value)[:40]}", param=name)
    return float(value)


def _integer(body: dict, name: str, low: int, high: int = 2**31 - 1) -> int:
    value = body[name]
    if type(value) is not int or not low <= value <= high:
        raise OpenAIError(f"'{name}' must be an integer in [{low}, {high}], got {json.dumps(value)[:40]}", param=name)
    return value


def _content(message: dict, i: int) -> str:
    """A message's content: a string, or text parts [{"type": "text", "text": ...}] joined."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                                         for p in content):
        return "".join(p["text"] for p in content)
    raise OpenAIError(f"messages[{i}].content must be a string or a list of text parts", param="messages")


def model_inputs(body, chat: bool, models: frozenset[str]) -> tuple[str, dict, bool, bool]:
    """(model, the dflash model's inputs as arrays, stream, include_usage) from an OpenAI request body."""
    if not isinstance(body, dict):
        raise OpenAIError("the body must be a JSON object")
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise OpenAIError(f"unknown or unsupported field '{unknown[0]}'", param=unknown[0])
    for name, values in OFF.items():
        if name in body and body[name] not in values:
            raise OpenAIError(f"'{name}' = {json.dumps(body[name])[:40]} is not supported by this server", param=name)
    model = body.get("model")
    if not isinstance(model, str):
        raise OpenAIError("'model' is required: one of " + ", ".join(sorted(models)), param="model")
    if model not in models:
        raise OpenAIError(f"the model '{model}' does not exist; served: {', '.join(sorted(models))}", 404, "model",
                          code="model_not_found")
    inputs: dict = {"stream": True}
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise OpenAIError("'messages' must be a non-empty list of message objects", param="messages")
        for i, m in enumerate(messages):
            if m.get("role") not in ("system", "user", "assistant"):
                raise OpenAIError(f"messages[{i}].role must be system, user or assistant", param="messages")
            extra = set(m) - {"role", "content", "name"}
            if extra:
                raise OpenAIError(f"messages[{i}]: unsupported field '{sorted(extra)[0]}'", param="messages")
        inputs["messages"] = json.dumps([{"role": m["role"], "content": _content(m, i)}
                                         for i, m in enumerate(messages)])
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str) and prompt:
            inputs["text_input"] = prompt
        elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
            inputs["input_ids"] = prompt
        else:
            raise OpenAIError("'prompt' must be a non-empty string or list of token ids (one prompt per request)",
                              param="prompt")
    for name in ("max_tokens", "max_completion_tokens"):
        if body.get(name) is not None:
            inputs["max_tokens"] = _integer(body, name, 1)
    if "max_tokens" not in inputs and not chat:
        inputs["max_tokens"] = 16  # OpenAI's completions default
    inputs["temperature"] = _number(body, "temperature", 0, 2) if body.get("temperature") is not None else 1.0
    if body.get("top_p") is not None:
        inputs["top_p"] = _number(body, "top_p", 0, 1)
        if inputs["top_p"] == 0:
            raise OpenAIError("'top_p' must be > 0", param="top_p")
    if body.get("top_k") is not None:
        inputs["top_k"] = _integer(body, "top_k", 0)
    if body.get("seed") is not None:
        inputs["seed"] = _integer(body, "seed", 0, 2**63 - 1)
    if body.get("ignore_eos") is not None:
        inputs["ignore_eos"] = body["ignore_eos"]
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not 0 < len(stops) <= 4 or not all(isinstance(s, str) and s for s in stops):
            raise OpenAIError("'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
        inputs["stop_words"] = stops
    stream = body.get("stream", False)
    if type(stream) is not bool:
        raise OpenAIError("'stream' must be true or false", param="stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise OpenAIError("'stream_options' supports only include_usage", param="stream_options")
    try:
        arrays = generate_inputs(inputs)
    except RequestError as exc:
        raise OpenAIError(exc.format_message()) from None
    return model, arrays, stream, bool(options.get("include_usage"))


def usage(result) -> dict:
    prompt, completion = int(output_value(result, "num_prompt_tokens")), int(output_value(result, "num_output_tokens"))
    cached = int(output_value(result, "cached_tokens") or 0)  # prompt tokens restored from the prefix cache
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def dflash_stats(result) -> dict:
    return {"mean_acceptance_length": round(float(output_value(result, "mean_acceptance_length")), 4),
            "verify_steps": int(output_value(result, "verify_steps"))}


def finish_reason(result) -> str:
    reason = output_value(result, "finish_reason") or "stop"
    return "length" if reason == "length" else "stop"


class Reply:
    """OpenAI's response objects for one request."""

    def __init__(self, model: str, chat: bool):
        self.model, self.chat, self.created = model, chat, int(time.time())
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def full(self, text: str, result) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason(result)}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason(result)}
        return {**self._head("chat.completion" if self.chat else "text_completion"), "choices": [choice],
                "usage": usage(result), "dflash": dflash_stats(result)}

    def chunk(self, text: str | None, reason: str | None = None, first: bool = False) -> dict:
        if self.chat:
            delta = ({"role": "assistant", "content": text or ""} if first else
                     ({"content": text} if text is not None else {}))
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, result) -> dict:
        return {**self._head("chat.completion.chunk" if self.chat else "text_completion"), "choices": [],
                "usage": usage(result), "dflash": dflash_stats(result)}
