"""Strict reading of a KServe generate body (`/v2/models/<m>/generate[_stream]`) into typed inputs.

Triton's own HTTP parser converts JSON to the declared tensor types before any model code runs, and
it is lenient where a client's mistake should be an error: `max_tokens` 4294967300 wraps to 4, a
misspelled field is silently dropped (`max_token` -> the default 64), `"seed": -1` is refused with
a message about "non-signed-integer". The front (triton/front.py) reads the body here instead:
every field must be one of the model's inputs, every value of its type and in its type's range,
and the error names the field and what was expected. The result goes to Triton over gRPC.
"""

from __future__ import annotations

import json
import math

import numpy as np

from dflash_trt.errors import RequestError
from dflash_trt.triton.ensemble import INPUTS as ENSEMBLE_INPUTS

INT32 = (-(2**31), 2**31 - 1)
# name: (kind, (low, high) for integers, Triton dtype, numpy type)
FIELDS = {
    "text_input": ("str", None, "BYTES", np.object_),
    "input_ids": ("int_list", (0, INT32[1]), "INT32", np.int32),
    "max_tokens": ("int", (1, INT32[1]), "INT32", np.int32),
    "stream": ("bool", None, "BOOL", np.bool_),
    "temperature": ("float", None, "FP32", np.float32),
    "top_p": ("float", None, "FP32", np.float32),
    "top_k": ("int", (0, INT32[1]), "INT32", np.int32),
    "seed": ("int", (0, 2**64 - 1), "UINT64", np.uint64),
    "stop_words": ("str_list", None, "BYTES", np.object_),
    "stop_token_ids": ("int_list", (0, INT32[1]), "INT32", np.int32),
    "chat": ("bool", None, "BOOL", np.bool_),
    "ignore_eos": ("bool", None, "BOOL", np.bool_),
    "messages": ("str", None, "BYTES", np.object_),
    "prefix_cache": ("bool", None, "BOOL", np.bool_),
    "bad_words": ("str_list", None, "BYTES", np.object_),
    "end_id": ("int", (0, INT32[1]), "INT32", np.int32),
    "pad_id": ("int", (0, INT32[1]), "INT32", np.int32),
    "random_seed": ("int", (0, 2**64 - 1), "UINT64", np.uint64),
}
# the `ensemble` model's (triton/ensemble.py: TensorRT-LLM's client names), sent shaped [1, ...]: the dflash
# field of the same name, or a flag
ENSEMBLE_FIELDS = {name: FIELDS.get(name, ("bool", None, "BOOL", np.bool_)) for name, *_ in ENSEMBLE_INPUTS}
ALL_FIELDS = {**ENSEMBLE_FIELDS, **FIELDS}
IGNORED = ("id",)  # KServe's request id: accepted, not an input


def _is_int(value) -> bool:
    return type(value) is int  # bool is an int subclass: true / false are not integers here


def _check(name: str, kind: str, bounds, value) -> list:
    """The field's values as a list; RequestError naming the field when it is not what it must be."""
    if kind == "str":
        if not isinstance(value, str):
            raise RequestError(f"field '{name}': expected a string, got {type(value).__name__}")
        return [value]
    if kind == "str_list":
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in items):
            raise RequestError(f"field '{name}': expected a string or a list of strings")
        return items
    if kind == "bool":
        if type(value) is not bool:
            raise RequestError(f"field '{name}': expected true or false, got {json_repr(value)}")
        return [value]
    if kind == "float":
        if not (_is_int(value) or isinstance(value, float)) or not math.isfinite(value):
            raise RequestError(f"field '{name}': expected a finite number, got {json_repr(value)}")
        return [float(value)]
    items = value if kind == "int_list" and isinstance(value, list) else [value]
    low, high = bounds
    for v in items:
        if not _is_int(v):
            raise RequestError(f"field '{name}': expected an integer, got {json_repr(v)}")
        if not low <= v <= high:
            raise RequestError(f"field '{name}': {v} is outside {low}..{high}")
    if kind == "int" and isinstance(value, list):
        raise RequestError(f"field '{name}': expected one integer, got a list")
    return items


def json_repr(value) -> str:
    """The value as JSON (ASCII: a lone surrogate stays an escape), cut to 40 characters."""
    text = json.dumps(value, ensure_ascii=True)
    return text if len(text) <= 40 else text[:37] + "..."


def generate_inputs(body, fields: dict = FIELDS, batched: bool = False) -> dict[str, np.ndarray]:
    """{input name: array of its Triton type} from a generate body; RequestError for anything else.
    `batched`: arrays shaped [1, n] (a model with a batch dimension, e.g. `ensemble`); a value sent
    with the batch dimension ([["text"]], [[64]]) is read as the same value."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object of input names to values")
    unknown = sorted(k for k in body if k not in fields and k not in IGNORED)
    if unknown:
        raise RequestError(f"unknown field '{unknown[0]}'; the inputs are: {', '.join(fields)}")
    arrays = {}
    for name, value in body.items():
        if name in IGNORED:
            continue
        kind, bounds, _, np_type = fields[name]
        if batched and isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
            value = value[0]  # [[...]]: the batch dimension of TensorRT-LLM's shapes
        if batched and kind in ("str", "int", "bool", "float") and isinstance(value, list) and len(value) == 1:
            value = value[0]
        items = _check(name, kind, bounds, value)
        if np_type is np.object_:
            try:
                items = [v.encode("utf-8") for v in items]
            except UnicodeEncodeError as exc:  # JSON can carry lone surrogates ("\ud800"); UTF-8 cannot
                raise RequestError(f"field '{name}': not encodable as UTF-8 ({exc.reason})") from None
        arrays[name] = np.array([items] if batched else items, dtype=np_type)
    return arrays
