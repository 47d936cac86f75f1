"""The `dflash` model's request/response tensors (Triton LLM conventions) and their validation.

Inputs follow the names of Triton's LLM ensembles / BLS so `/v2/models/dflash/generate` works
with the usual JSON (`{"text_input": ..., "max_tokens": 64, "stream": false}`). Every invalid
request becomes one clear `RequestError`; nothing here can take the server down.

Work before admission is bounded (`RequestLimits`): a text prompt longer in bytes than max_seq_len
tokens could possibly cover is refused before it is tokenized (so a 10 MB prompt costs a length
check, not seconds of the model thread), and stop words are limited in number and length.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.errors import RequestError

# name, Triton type, dims (max_batch_size 0: these are full shapes)
INPUTS = [
    ("text_input", "TYPE_STRING", [1]),
    ("input_ids", "TYPE_INT32", [-1]),
    ("max_tokens", "TYPE_INT32", [1]),
    ("stream", "TYPE_BOOL", [1]),
    ("temperature", "TYPE_FP32", [1]),
    ("top_p", "TYPE_FP32", [1]),
    ("top_k", "TYPE_INT32", [1]),
    ("seed", "TYPE_UINT64", [1]),
    ("stop_words", "TYPE_STRING", [-1]),
    ("stop_token_ids", "TYPE_INT32", [-1]),
    ("chat", "TYPE_BOOL", [1]),
    ("ignore_eos", "TYPE_BOOL", [1]),
    ("messages", "TYPE_STRING", [1]),  # a chat as JSON [{"role", "content"}]: the tokenizer's chat template
    ("prefix_cache", "TYPE_BOOL", [1]),  # false: neither restore a cached prefix nor cache this request's blocks
    # TensorRT-LLM's names (its ensemble / BLS inputs):
    ("bad_words", "TYPE_STRING", [-1]),  # each word never generated (decoding/bad_words.py)
    ("end_id", "TYPE_INT32", [1]),  # the end token, instead of the bundle's EOS ids
    ("pad_id", "TYPE_INT32", [1]),  # accepted and checked; outputs are never padded (one sequence each)
    ("random_seed", "TYPE_UINT64", [1]),  # `seed`'s TensorRT-LLM name before tensorrtllm_backend c2e65b8
    ("cancel_request_id", "TYPE_STRING", [1]),  # internal: the ensemble adapter cancels its forwarded request
]
OUTPUTS = [
    ("text_output", "TYPE_STRING", [1]),  # streaming: the new text of this response; else the full text
    ("output_ids", "TYPE_INT32", [-1]),  # streaming: the new tokens; else all generated tokens
    ("finish_reason", "TYPE_STRING", [1]),  # "" until the final response: stop | length | cancelled
    ("num_output_tokens", "TYPE_INT32", [1]),
    ("num_prompt_tokens", "TYPE_INT32", [1]),
    ("verify_steps", "TYPE_INT32", [1]),
    ("mean_acceptance_length", "TYPE_FP32", [1]),
    ("acceptance_lengths", "TYPE_INT32", [-1]),  # tokens committed per verify step (final response)
    # TensorRT-LLM llmapi's speculative statistics (final response; 0 before it)
    ("total_draft_tokens", "TYPE_INT32", [1]),
    ("total_accepted_draft_tokens", "TYPE_INT32", [1]),
    ("acceptance_rate", "TYPE_FP32", [1]),  # total_accepted_draft_tokens / total_draft_tokens (0 without drafts)
    ("cached_tokens", "TYPE_INT32", [1]),  # prompt tokens restored from the prefix cache (final response)
]
INTERNAL_INPUTS = ("cancel_request_id",)  # not a client's: no field of the HTTP generate body
DEFAULT_MAX_TOKENS = 64


@dataclass(frozen=True)
class RequestLimits:
    """Bounds checked before any per-request work (see the module docstring)."""

    max_prompt_bytes: int | None = None  # None: not bounded by bytes (the token count still is)
    max_stop_words: int = 64
    max_stop_word_bytes: int = 512
    max_stop_token_ids: int = 1024
    sampled_requests: bool = True  # False: the bundle serves temperature 0 only (runtime.sampled_requests)

    @classmethod
    def for_tokenizer(cls, tokenizer, max_seq_len: int) -> "RequestLimits":
        """max_prompt_bytes = (max_seq_len - 1) x the longest token's bytes: a longer prompt has more
        than max_seq_len - 1 tokens whatever it says."""
        if tokenizer is None:
            return cls()
        longest = max((len(piece.encode("utf-8")) for piece in tokenizer.get_vocab()), default=1)
        return cls(max_prompt_bytes=(max_seq_len - 1) * max(longest, 1))


@dataclass
class ParsedRequest:
    request: Request
    stream: bool


def _scalar(get: Callable, name: str, kind: type, default):
    value = get(name)
    if value is None:
        return default
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise RequestError(f"input '{name}': expected one value, got {flat.size}")
    item = flat[0]
    if kind is bool:
        return bool(item)
    if kind is int:
        return int(item)
    number = float(item)
    if not math.isfinite(number):
        raise RequestError(f"input '{name}': expected a finite number, got {number}")
    return number


def _strings(get: Callable, name: str) -> list[str]:
    value = get(name)
    if value is None:
        return []
    out = []
    for item in np.asarray(value, dtype=object).reshape(-1):
        out.append(_utf8(item, name))
    return [s for s in out if s]


def _utf8(item, name: str) -> str:
    if isinstance(item, str):
        return item
    try:
        return bytes(item).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"input '{name}': not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


CHAT_ROLES = ("system", "user", "assistant")


def _chat_prompt(raw, tokenizer, max_seq_len: int, limits: RequestLimits) -> list[int]:
    """Token ids of a chat (`messages`: JSON [{"role": ..., "content": ...}]) through the chat template."""
    size = len(raw) if isinstance(raw, bytes) else len(str(raw).encode("utf-8"))
    if limits.max_prompt_bytes is not None and size > limits.max_prompt_bytes + 64 * 1024:
        raise RequestError(f"input 'messages': {size} bytes is more than this bundle's longest prompt can hold")
    try:
        messages = json.loads(_utf8(raw, "messages"))
    except json.JSONDecodeError as exc:
        raise RequestError(f"input 'messages': not JSON ({exc.msg} at {exc.pos})") from None
    if not isinstance(messages, list) or not messages:
        raise RequestError("input 'messages': expected a non-empty list of {\"role\", \"content\"} objects")
    for i, m in enumerate(messages):
        if not (isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in CHAT_ROLES
                and isinstance(m["content"], str)):
            raise RequestError(f"input 'messages': message {i} must be {{\"role\": one of {', '.join(CHAT_ROLES)}, "
                               "\"content\": a string}")
    if tokenizer is None:
        raise RequestError("input 'messages': this bundle has no tokenizer; send 'input_ids'")
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError("input 'messages': this bundle's tokenizer has no chat template; send 'text_input'")
    from dflash_trt.tokenizer import encode_chat

    ids = encode_chat(tokenizer, messages)
    if len(ids) >= max_seq_len:
        raise RequestError(f"the prompt has {len(ids)} tokens; this bundle allows at most {max_seq_len - 1}")
    return ids


def _prompt(get: Callable, tokenizer, chat: bool, max_seq_len: int, limits: RequestLimits) -> list[int]:
    messages = get("messages")
    if messages is not None:
        if get("text_input") is not None or get("input_ids") is not None:
            raise RequestError("input 'messages': send either messages, text_input or input_ids")
        flat = np.asarray(messages, dtype=object).reshape(-1)
        if flat.size != 1:
            raise RequestError(f"input 'messages': expected one JSON string, got {flat.size}")
        return _chat_prompt(flat[0], tokenizer, max_seq_len, limits)
    ids = get("input_ids")
    if ids is not None:
        flat = np.asarray(ids).reshape(-1)
        if flat.size >= max_seq_len:
            raise RequestError(f"the prompt has {flat.size} tokens; this bundle allows at most {max_seq_len - 1}")
        return [int(t) for t in flat]
    text = get("text_input")
    if text is None:
        raise RequestError("input 'text_input' (or 'input_ids') is required")
    flat = np.asarray(text, dtype=object).reshape(-1)
    if flat.size != 1:
        raise RequestError(f"input 'text_input': expected one string, got {flat.size}")
    raw = flat[0]
    size = len(raw) if isinstance(raw, bytes) else len(str(raw).encode("utf-8"))
    if limits.max_prompt_bytes is not None and size > limits.max_prompt_bytes:
        raise RequestError(f"input 'text_input': {size} bytes is more than {max_seq_len - 1} tokens, this bundle's "
                           f"longest prompt, can hold (at most {limits.max_prompt_bytes} bytes)")
    prompt = _utf8(raw, "text_input")
    if not prompt:
        raise RequestError("input 'text_input': the prompt is empty")
    if tokenizer is None:
        raise RequestError("input 'text_input': this bundle has no tokenizer; send 'input_ids'")
    if chat:
        from dflash_trt.tokenizer import encode_prompt

        return encode_prompt(tokenizer, prompt, chat=True)
    return tokenizer.encode(prompt, add_special_tokens=True)


def _word_list(get: Callable, name: str, what: str, tokenizer, limits: RequestLimits, without_tokenizer: str) -> list[str]:
    """The non-empty strings of input `name` (stop words, bad words), within the count and byte limits."""
    value = get(name)
    count = 0 if value is None else np.asarray(value, dtype=object).size
    if count > limits.max_stop_words:
        raise RequestError(f"input '{name}': {count} {what}s; at most {limits.max_stop_words}")
    words = _strings(get, name)
    long = [w for w in words if len(w.encode("utf-8")) > limits.max_stop_word_bytes]
    if long:
        raise RequestError(f"input '{name}': a {what} of {len(long[0].encode('utf-8'))} bytes; at most "
                           f"{limits.max_stop_word_bytes}")
    if words and tokenizer is None:
        raise RequestError(f"input '{name}': this bundle has no tokenizer{without_tokenizer}")
    return words


def _stop_words(get: Callable, tokenizer, limits: RequestLimits) -> list[str]:
    return _word_list(get, "stop_words", "stop word", tokenizer, limits, "; use 'stop_token_ids'")


def _bad_words(get: Callable, tokenizer, limits: RequestLimits) -> tuple[tuple[int, ...], ...]:
    """Each non-empty word tokenized without special tokens, as TensorRT-LLM's preprocessing model does."""
    words = _word_list(get, "bad_words", "bad word", tokenizer, limits, "")
    ids = [tuple(tokenizer.encode(w, add_special_tokens=False)) for w in words]
    return tuple(w for w in ids if w)


def _token_id(get: Callable, name: str, vocab_size: int) -> int | None:
    value = _scalar(get, name, int, None)
    if value is not None and not 0 <= value < vocab_size:
        raise RequestError(f"input '{name}': {value} is outside the vocabulary 0..{vocab_size - 1}")
    return value


def _stop_token_ids(get: Callable, limits: RequestLimits) -> set[int]:
    value = get("stop_token_ids")
    flat = np.asarray(value if value is not None else []).reshape(-1)
    if flat.size > limits.max_stop_token_ids:
        raise RequestError(f"input 'stop_token_ids': {flat.size} ids; at most {limits.max_stop_token_ids}")
    return {int(t) for t in flat}


def parse_request(get: Callable, tokenizer, max_seq_len: int, vocab_size: int,
                  eos_ids: frozenset[int] = frozenset(), limits: RequestLimits = RequestLimits()) -> ParsedRequest:
    """Validate one request's inputs (`get(name)` -> numpy array or None) into a `Request`."""
    stop_words, stop_ids = _stop_words(get, tokenizer, limits), _stop_token_ids(get, limits)  # cheap checks first
    bad_words = _bad_words(get, tokenizer, limits)
    prompt = _prompt(get, tokenizer, _scalar(get, "chat", bool, False), max_seq_len, limits)
    if not prompt:
        raise RequestError("the prompt is empty")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"input 'input_ids': {bad[:5]} outside the vocabulary 0..{vocab_size - 1}")
    max_tokens = _scalar(get, "max_tokens", int, DEFAULT_MAX_TOKENS)
    if max_tokens < 1:
        raise RequestError(f"input 'max_tokens': must be >= 1, got {max_tokens}")
    if len(prompt) >= max_seq_len:
        raise RequestError(f"the prompt has {len(prompt)} tokens; this bundle allows at most {max_seq_len - 1}")
    if len(prompt) + max_tokens > max_seq_len:
        raise RequestError(
            f"input 'max_tokens': prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds this "
            f"bundle's max_seq_len ({max_seq_len}); ask for at most {max_seq_len - len(prompt)}"
        )
    temperature = _scalar(get, "temperature", float, 0.0)
    top_p = _scalar(get, "top_p", float, 1.0)
    top_k = _scalar(get, "top_k", int, 0)
    if get("seed") is not None and get("random_seed") is not None:
        raise RequestError("input 'random_seed': send either seed or random_seed (its older name), not both")
    seed = _scalar(get, "seed", int, None)
    seed = _scalar(get, "random_seed", int, 0) if seed is None else seed
    if temperature < 0:
        raise RequestError(f"input 'temperature': must be >= 0, got {temperature}")
    if temperature > 0 and not limits.sampled_requests:
        raise RequestError(f"input 'temperature': this bundle serves greedy requests only (built with "
                           f"runtime.sampled_requests: false), got {temperature}; send temperature 0, or rebuild "
                           "with runtime.sampled_requests: true")
    if not 0 < top_p <= 1:
        raise RequestError(f"input 'top_p': must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise RequestError(f"input 'top_k': must be >= 0 (0 = off), got {top_k}")
    end_id = _token_id(get, "end_id", vocab_size)
    _token_id(get, "pad_id", vocab_size)
    if not _scalar(get, "ignore_eos", bool, False):
        stop_ids |= {end_id} if end_id is not None else set(eos_ids)
    request = Request(
        tuple(prompt),
        SamplingParams(temperature, top_k, top_p, seed % 2**64),
        StopCriteria(max_tokens, frozenset(stop_ids), tuple(stop_words)),
        bad_words,
        _scalar(get, "prefix_cache", bool, True),
    )
    return ParsedRequest(request, _scalar(get, "stream", bool, False))
