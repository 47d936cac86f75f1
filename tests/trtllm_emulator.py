"""An emulator of TensorRT-LLM 1.2.1's Executor around our target engine, for the trtllm runner's CPU tests.

TensorRT-LLM cannot run here. This answers `enqueue_requests` / `await_responses` the way upstream's
executor does, computing the engine's DFlash outputs (docs/trtllm-backend.md: dflash_taps,
dflash_accept, dflash_tail_logits) with the torch target over each request's input. What it encodes
is UPSTREAM's behaviour, each rule with the upstream NVIDIA/TensorRT-LLM source it follows (paths under
cpp/, with the commit they were read at), not what our runner would like:

- result names and shapes: an output requested with gather_context=True is returned twice,
  `context_<name>` [promptLen, X] and `generation_<name>` [beam=1, maxNewTokens=1, X] (its last row);
  without it, `generation_<name>` only (LlmRequest::createResult,
  tensorrt_llm/batch_manager/llmRequest.cpp@89fd9b7; allocAdditionalOutputs,
  include/tensorrt_llm/batch_manager/llmRequest.h);
- a request may only ask for outputs registered in the ExecutorConfig, and for a context output only
  when registered with gather_context ("Additional context output tensor not gathered",
  findOutputTensor, tensorrt_llm/batch_manager/utils/inflightBatchingUtils.cpp@a35c38f);
- KV-cache block reuse: full blocks of tokens_per_block tokens are shared between requests with the
  same token prefix AND the same cache_salt_id (BlockKey equality includes cacheSaltID,
  tensorrt_llm/batch_manager/kvCacheManager.cpp@b35ac1b); at least the last prompt token is always computed;
- a reused prefix's rows of `context_<name>` are never written (copyAdditionalOutputs copies the
  chunk to getContextCurrentPosition(), inflightBatchingUtils.cpp); the host buffer comes from a pinned pool and is
  not cleared, so they hold garbage: NaN here, so that reading them shows;
- per-request outputs (gather_context=False) take the request's own row of the engine output, which
  the engine computes over the request's computed rows only (tail rows clamp, valid_rows counts them);
- every output the engine marks must be registered (TensorRT binds every I/O tensor before
  enqueueV3: IExecutionContext::setTensorAddress), and no step holds more than max_num_tokens
  computed rows (the executor schedules the rest in a later iteration; RuntimeBuffers sizes every
  additional output [max_num_tokens, X], tensorrt_llm/batch_manager/runtimeBuffers.cpp@2a9abd9).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from dflash_trt.backends.trtllm.target_model_cls import tail_rows_reference
from dflash_trt.decoding.verify import accept_length
from dflash_trt.model.kv_cache import KVCache


class _Obj(SimpleNamespace):
    def __init__(self, *args, **kwargs):
        super().__init__(args=args, **kwargs)


TLE = SimpleNamespace(Request=_Obj, SamplingConfig=_Obj, OutputConfig=_Obj,
                      AdditionalModelOutput=lambda name, gather: (name, gather))


class ExecutorError(RuntimeError):
    """What the executor would raise (a TLLM_CHECK) for a request it cannot serve."""


class ExecutorEmulator:
    def __init__(self, target, tap_layers, num_drafts, registered: list[tuple[str, bool]], engine_outputs: set[str],
                 tokens_per_block: int = 4, max_num_tokens: int = 10_000, drop_rows: int = 0):
        missing = engine_outputs - {name for name, _ in registered}
        if missing:
            raise ExecutorError(f"engine outputs without a buffer (not in additional_model_outputs): {sorted(missing)}")
        self.target, self.tap_layers, self.k = target, tuple(tap_layers), num_drafts
        self.registered, self.engine_outputs = dict(registered), engine_outputs
        self.tokens_per_block, self.max_num_tokens, self.drop_rows = tokens_per_block, max_num_tokens, drop_rows
        self.blocks: set[tuple] = set()  # (salt, token prefix) of every stored full KV block
        self.responses, self.inputs, self.computed, self.salts = {}, [], [], []

    # --- executor API ---------------------------------------------------------------------------
    def enqueue_requests(self, requests):
        ids = []
        for request in requests:
            ids.append(len(self.inputs))
            tokens, salt = list(request.input_token_ids), getattr(request, "cache_salt_id", None)
            self.inputs.append(tokens)
            self.salts.append(salt)
            outputs = self._serve(tokens, salt, request.output_config.additional_model_outputs)
            self.responses[ids[-1]] = SimpleNamespace(has_error=lambda: False, result=SimpleNamespace(
                additional_outputs=[SimpleNamespace(name=n, output=t) for n, t in outputs.items()]))
        return ids

    def await_responses(self, request_id):
        return [self.responses.pop(request_id)]

    # --- one request --------------------------------------------------------------------------
    def _reused(self, tokens: list[int], salt) -> int:
        """Tokens covered by stored full blocks of the same salt; the last token is always computed."""
        n, b, reused = len(tokens), self.tokens_per_block, 0
        while reused + b <= n - 1 and (salt, tuple(tokens[: reused + b])) in self.blocks:
            reused += b
        return reused

    @torch.inference_mode()
    def _serve(self, tokens: list[int], salt, requested) -> dict:
        for name, gather in requested:
            if name not in self.registered:
                raise ExecutorError(f"Additional generation output tensor not found: {name}")
            if gather and not self.registered[name]:
                raise ExecutorError(f"Additional context output tensor not gathered: {name}")
        n = len(tokens)
        reused = self._reused(tokens, salt)
        computed = n - reused
        self.computed.append(computed)
        if computed > self.max_num_tokens:
            raise ExecutorError(f"{computed} context tokens exceed max_num_tokens {self.max_num_tokens}")
        cache = KVCache(len(self.target.model.layers), 1, n + 1, 2, 16)
        logits, taps = self.target(torch.tensor([tokens]), torch.arange(n)[None], cache, torch.tensor([0]),
                                   self.tap_layers)
        # the engine sees only the computed rows [reused, n): its tail rows clamp to them
        rows, valid = tail_rows_reference([computed], self.k)
        rows, valid = torch.from_numpy(rows[0]) + reused, int(valid[0]) - self.drop_rows
        tail_logits = logits[0, rows]  # [K+1, V]
        verified = tail_logits.argmax(-1)
        drafts = torch.tensor(tokens)[rows[1:]]
        accepted = int(accept_length(drafts[None], verified[None])[0])
        per_token = {"dflash_taps": taps[0]}  # [n, X]: rows [reused, n) computed this step
        per_request = {"dflash_accept": torch.tensor([accepted, valid, *verified.tolist()], dtype=torch.int32),
                       "dflash_tail_logits": tail_logits.reshape(-1)}
        out = {}
        for name, gather in requested:
            if name not in self.engine_outputs:
                raise ExecutorError(f"the engine has no output {name}")
            if name in per_token:
                rows_out = per_token[name]
                if gather:
                    host = torch.full_like(rows_out, float("nan"))  # pinned pool, never cleared
                    host[reused:] = rows_out[reused:]
                    out[f"context_{name}"] = host
                out[f"generation_{name}"] = rows_out[-1].reshape(1, 1, -1)
            else:
                out[f"generation_{name}"] = per_request[name].reshape(1, 1, -1)
        for end in range(self.tokens_per_block, n + 1, self.tokens_per_block):  # blocks stored when it completes
            self.blocks.add((salt, tuple(tokens[:end])))
        return out
