"""`ensemble`: the dflash model under TensorRT-LLM's Triton client conventions (a BLS adapter).

Client code written for TensorRT-LLM's Triton backend calls a model named `ensemble` with tensors
shaped [batch, ...] (its ensemble has max_batch_size > 0: NVIDIA/TensorRT-LLM
triton_backend/all_models/inflight_batcher_llm/ensemble/config.pbtxt@2a9abd9) and the
names `text_input`, `max_tokens`, `bad_words`, `stop_words`, `end_id`, `pad_id`, `top_k`, `top_p`,
`temperature`, `seed` (`random_seed` before tensorrtllm_backend c2e65b8), `stream`,
`exclude_input_in_output`; it reads `text_output` and the llmapi statistics. This model declares
exactly those (max_batch_size 1: one prompt per request, [1, ...] shapes; Triton refuses any other
input by name), and forwards each request to `dflash` in-process over BLS, so the bundle is loaded
once and the one scheduler batches both models' requests.

Like TensorRT-LLM's ensemble (exclude_input_in_output false by default), a non-streaming
`text_output` starts with the prompt; streaming responses carry only new text. `pad_id` is checked
and has no effect: one sequence per response, never padded. A cancelled request cancels its dflash
request (Triton 2.51's BLS has no cancel: the adapter sends dflash a `cancel_request_id` request).
"""

from __future__ import annotations

import json
import logging
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dflash_trt.errors import RequestError

TARGET_MODEL = "dflash"
# name, Triton type, dims (after the batch dimension)
INPUTS = [
    ("text_input", "TYPE_STRING", [-1]),  # [1] in current TensorRT-LLM, [-1] in older templates: both fit
    ("max_tokens", "TYPE_INT32", [-1]),
    ("bad_words", "TYPE_STRING", [-1]),
    ("stop_words", "TYPE_STRING", [-1]),
    ("end_id", "TYPE_INT32", [1]),
    ("pad_id", "TYPE_INT32", [1]),
    ("top_k", "TYPE_INT32", [1]),
    ("top_p", "TYPE_FP32", [1]),
    ("temperature", "TYPE_FP32", [1]),
    ("seed", "TYPE_UINT64", [1]),
    ("random_seed", "TYPE_UINT64", [1]),  # the name before tensorrtllm_backend c2e65b8 (2025-05-13)
    ("stream", "TYPE_BOOL", [1]),
    ("exclude_input_in_output", "TYPE_BOOL", [1]),
    ("return_num_input_tokens", "TYPE_BOOL", [1]),  # the outputs are always there; accepted
    ("return_num_output_tokens", "TYPE_BOOL", [1]),
]
OUTPUTS = [
    ("text_output", "TYPE_STRING", [-1]),
    ("finish_reason", "TYPE_STRING", [-1]),  # TensorRT-LLM llmapi's; "" until the final response
    ("num_input_tokens", "TYPE_INT32", [1]),
    ("num_output_tokens", "TYPE_INT32", [1]),
    ("acceptance_rate", "TYPE_FP32", [1]),
    ("total_accepted_draft_tokens", "TYPE_INT32", [1]),
    ("total_draft_tokens", "TYPE_INT32", [1]),
]
RENAMED = {"random_seed": "seed"}  # ensemble name -> dflash input
LOCAL = ("exclude_input_in_output", "return_num_input_tokens", "return_num_output_tokens")  # read here only
DFLASH_OUTPUTS = ["text_output", "finish_reason", "num_prompt_tokens", "num_output_tokens", "acceptance_rate",
                  "total_accepted_draft_tokens", "total_draft_tokens"]
CANCEL_PREFIX = "dflash-ensemble-"  # request ids whose cancellation the adapter forwards

log = logging.getLogger(__name__)


def dflash_inputs(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The dflash model's inputs for one ensemble request ({name: array with its batch dimension})."""
    if "seed" in arrays and "random_seed" in arrays:
        raise RequestError("send either 'seed' or 'random_seed' (its older name), not both")
    out = {}
    for name, array in arrays.items():
        if name in LOCAL:
            continue
        if array.shape[:1] != (1,):
            raise RequestError(f"input '{name}': one prompt per request (batch 1), got shape {list(array.shape)}")
        flat = array.reshape(-1)
        if name in ("text_input", "max_tokens") and flat.size != 1:
            raise RequestError(f"input '{name}': expected one value, got {flat.size}")
        out[RENAMED.get(name, name)] = flat
    if "text_input" not in out:
        raise RequestError("input 'text_input' is required")
    return out


class EnsembleAdapter:
    def __init__(self, pb, args: dict):
        self.pb = pb
        config = json.loads(args["model_config"])
        if not pb.using_decoupled_model_transaction_policy(config):
            raise pb.TritonModelException("the ensemble model must be decoupled (model_transaction_policy)")
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        self.target = params.get("target_model", TARGET_MODEL)
        self.pool = ThreadPoolExecutor(max_workers=int(params.get("max_in_flight", "256")),
                                       thread_name_prefix="dflash-ensemble")

    def execute(self, requests) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                arrays = {}
                for name, *_ in INPUTS:
                    tensor = self.pb.get_input_tensor_by_name(request, name)
                    if tensor is not None:
                        arrays[name] = tensor.as_numpy()
                inputs = dflash_inputs(arrays)
            except RequestError as exc:
                self._fail(sender, exc.format_message())
                continue
            stream = _flag(arrays, "stream")
            inputs["stream"] = np.array([True])  # dflash streams to the adapter: a cancel check per step
            echo = not stream and not _flag(arrays, "exclude_input_in_output")
            self.pool.submit(self._relay, request, sender, inputs, stream, echo)
        return None

    def _fail(self, sender, message: str) -> None:
        pb = self.pb
        sender.send(pb.InferenceResponse(output_tensors=[], error=pb.TritonError(message)),
                    flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _relay(self, request, sender, inputs: dict[str, np.ndarray], stream: bool, echo: bool) -> None:
        """Forward one request to dflash and its responses back, renamed and batch-shaped: each one
        (stream), or the prompt (echo) + all of the text in one final response."""
        pb = self.pb
        request_id = CANCEL_PREFIX + uuid.uuid4().hex
        text = [_text(inputs["text_input"][0])] if echo else []
        try:
            bls = pb.InferenceRequest(model_name=self.target, request_id=request_id,
                                      inputs=[pb.Tensor(n, a) for n, a in inputs.items()],
                                      requested_output_names=DFLASH_OUTPUTS)
            for response in bls.exec(decoupled=True):
                if response.has_error():
                    self._fail(sender, response.error().message())
                    return
                if not response.output_tensors():  # an empty closing response
                    continue
                final = bool(_value(pb, response, "finish_reason"))
                if stream:
                    sender.send(self._response(response, _value(pb, response, "text_output")),
                                flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
                else:
                    text.append(_value(pb, response, "text_output"))
                    if final:
                        sender.send(self._response(response, "".join(text)), flags=pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                if final:
                    return
                if sender.is_cancelled() if hasattr(sender, "is_cancelled") else request.is_cancelled():
                    self._cancel(request_id)
                    self._fail(sender, "the request was cancelled")
                    return
            self._fail(sender, f"the {self.target} model ended the request without a final response")
        except Exception as exc:  # noqa: BLE001 - one failed request never stops the adapter
            log.exception("ensemble request failed")
            try:
                self._fail(sender, f"internal error in the ensemble adapter: {exc!r}")
            except Exception:  # noqa: BLE001 - the client is gone
                pass

    def _cancel(self, request_id: str) -> None:
        pb = self.pb
        tensor = pb.Tensor("cancel_request_id", np.array([request_id.encode()], dtype=np.object_))
        for _ in pb.InferenceRequest(model_name=self.target, inputs=[tensor],
                                     requested_output_names=["finish_reason"]).exec(decoupled=True):
            pass

    def _response(self, response, text: str):
        pb = self.pb

        def tensor(name, dflash_name=None):
            return pb.get_output_tensor_by_name(response, dflash_name or name).as_numpy()

        tensors = [
            pb.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=np.object_)),
            pb.Tensor("finish_reason", tensor("finish_reason").reshape(1, -1)),
            pb.Tensor("num_input_tokens", tensor("num_input_tokens", "num_prompt_tokens").reshape(1, 1)),
            *(pb.Tensor(name, tensor(name).reshape(1, 1)) for name in
              ("num_output_tokens", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens")),
        ]
        return pb.InferenceResponse(output_tensors=tensors)

    def finalize(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _flag(arrays: dict, name: str) -> bool:
    value = arrays.get(name)
    return bool(value.reshape(-1)[0]) if value is not None and value.size else False


def _text(item) -> str:
    return item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)


def _value(pb, response, name: str):
    tensor = pb.get_output_tensor_by_name(response, name)
    if tensor is None:
        return None
    flat = tensor.as_numpy().reshape(-1)
    return _text(flat[0]) if flat.size else ""
