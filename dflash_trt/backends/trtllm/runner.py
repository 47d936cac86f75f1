"""The runner contract (runtime/runner.py) on TensorRT-LLM engines: `TrtllmTargetRunner`.

The target engine (docs/trtllm-backend.md) is driven through TensorRT-LLM 1.2.1's C++ `Executor`
(`tensorrt_llm.bindings.executor`) with "prompt-append" verification: every step sends, per slot,
one request whose input is the slot's committed tokens up to the bonus token plus the drafts
[bonus, d_1 .. d_K], with `max_tokens=1`; KV-cache block reuse recomputes only the last rows.

What the executor returns, as upstream builds it (LlmRequest::createResult in
cpp/tensorrt_llm/batch_manager/llmRequest.cpp@89fd9b7; copyAdditionalOutputs in
cpp/tensorrt_llm/batch_manager/utils/inflightBatchingUtils.cpp@a35c38f): an output registered with
gather_context=True comes back as `context_<name>` [promptLen, X], written from getContextCurrentPosition()
(rows of a reused prefix are never written), AND `generation_<name>` [1, 1, X]; one registered without it
as `generation_<name>` only. So this runner reads
- `context_dflash_taps`: the taps of the prompt (prefill) or of the block rows start..start+w (verify);
- `generation_dflash_accept`: [accepted, valid_rows, t_0 .. t_K] of the in-engine DFlashVerify;
- `generation_dflash_tail_logits`: the block logits, for sampled requests (engines built with
  runtime.sampled_requests), verified here by the same kernel (`dflash_trt.kernels.verify_block`).

KV block reuse hands a new sequence the blocks of an earlier one with the same prefix and leaves the reused
rows of its taps unwritten (garbage rows of the right shape: the drafter's context would be wrong, acceptance
would collapse, output would stay lossless). Blocks are shared only between requests of equal `cache_salt_id`
(BlockKey in cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp@b35ac1b; Request binding, TensorRT-LLM >= 1.1),
and the executor does not say how many rows it reused, so the runner keeps a mirror of the full blocks it has
sent under the shared salt (`EngineBlocks`: an upper bound of what the engine can reuse, since it may evict but
never holds a block not sent). A request uses the shared salt only when that bound stays within what it does not
need from the engine: a prompt's positions the prefix cache restored into the drafter (`cached`), a verify's
positions before its block. Otherwise the sequence takes a salt of its own (its later verifies reuse its own
history). So with the prefix cache (runtime/prefix_cache.py: the drafter's context per cached block, kept by the
draft runner) a prompt sharing a cached prefix skips its prefill in the engine and drafts from the full context;
without it every sequence keeps to itself.

The runner keeps each slot's committed token ids; `commit(slots, lengths)` truncates them, so a
rewind is a length change as in the torch runner. tensorrt_llm is imported in `open` only.
The draft side is `draft_runner.GraphDraftRunner` over TensorRT sessions (`load_trtllm_runners`).
"""

from __future__ import annotations

import itertools
import json
import secrets
from pathlib import Path

import torch

from dflash_trt.backends.trtllm import versions
from dflash_trt.backends.trtllm.io_spec import ENGINE_CONFIG_FILE
from dflash_trt.backends.trtllm.target_build import TOKENS_PER_BLOCK
from dflash_trt.decoding.batch import pad_prompts
from dflash_trt.decoding.verify import accept_length
from dflash_trt.errors import CheckpointError, MissingDependencyError
from dflash_trt.kernels import sample_tokens

TAPS, ACCEPT, TAIL_LOGITS = "dflash_taps", "dflash_accept", "dflash_tail_logits"
MIRROR_BLOCKS = 1 << 20  # shared blocks the mirror tracks before the shared salt moves on (~100 MB of keys)


class EngineBlocks:
    """The full KV blocks sent to the engine under the shared salt, as chained keys (a block's key hashes its tokens
    with its parent's key, as the engine's BlockKey chains them). `reusable` bounds what the engine can reuse for a
    request; at MIRROR_BLOCKS the salt moves on (blocks under a retired one can no longer be reused by a request
    of the new one, so forgetting them is safe; sequences still on a retired salt move to their own)."""

    def __init__(self, tokens_per_block: int, first_salt: int, next_salt):
        self.size, self.next_salt = tokens_per_block, next_salt
        self.salt, self.keys, self.retired = first_salt, set(), set()

    def move_on_if_full(self) -> None:
        if len(self.keys) > MIRROR_BLOCKS:
            self.retired.add(self.salt)
            self.salt, self.keys = next(self.next_salt), set()

    def _chain(self, tokens: list[int], limit: int):
        key = None
        for end in range(self.size, limit + 1, self.size):
            key = hash((key, tuple(tokens[end - self.size: end])))
            yield end, key

    def reusable(self, tokens: list[int]) -> int:
        """Tokens the engine may reuse for `tokens` under the shared salt (at least the last one is computed)."""
        reused = 0
        for end, key in self._chain(tokens, len(tokens) - 1):
            if key not in self.keys:
                break
            reused = end
        return reused

    def sent(self, tokens: list[int]) -> None:
        """A request under the shared salt: the engine stores each full block of it."""
        self.keys.update(key for _, key in self._chain(tokens, len(tokens)))


def parse_accept(row: torch.Tensor, num_drafts: int) -> tuple[int, int, list[int]]:
    """One `dflash_accept` row [2 + K + 1] -> (accepted, valid_rows, target tokens t_0..t_K)."""
    values = [int(v) for v in row.reshape(-1).tolist()]
    if len(values) != num_drafts + 3:
        raise CheckpointError(f"dflash_accept has {len(values)} values, expected {num_drafts + 3} for K={num_drafts}")
    return values[0], values[1], values[2:]


def block_input(history: list[int], start: int, block: list[int]) -> list[int]:
    """The verify request's input ids: committed tokens before the bonus, then [bonus, d_1 .. d_k]."""
    if start > len(history):
        raise ValueError(f"block starts at {start} but only {len(history)} tokens are committed")
    return history[:start] + block


def result_name(name: str, gather_context: bool) -> str:
    """The name createResult gives an output: context_ for the prompt rows of a gather_context output,
    generation_ otherwise (a gather_context output is returned under both)."""
    return f"{'context' if gather_context else 'generation'}_{name}"


def output_tensor(outputs: dict, name: str, gather_context: bool) -> torch.Tensor:
    """An additional output of one response, by how it was registered."""
    key = result_name(name, gather_context)
    if key not in outputs:
        raise CheckpointError(f"the target engine returned no '{key}' (got {sorted(outputs)}); rebuild the bundle")
    value = outputs[key]
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)


class TrtllmTargetRunner:
    def __init__(self, executor, tle, settings: dict, n_slots: int, device="cuda"):
        """`executor`: a tensorrt_llm.bindings.executor.Executor; `tle`: that bindings module."""
        self.executor, self.tle, self.settings = executor, tle, settings
        self.num_drafts, self.vocab_size = settings["num_drafts"], settings["vocab_size"]
        self.tap_width = len(settings["target_layer_ids"]) * settings["hidden_size"]
        self.registered = {o["name"]: bool(o["gather_context"]) for o in settings["outputs"]}
        for name in (TAPS, ACCEPT):
            if name not in self.registered:
                raise CheckpointError(f"dflash_target.json: outputs lack '{name}'; rebuild the bundle")
        self.device = torch.device(device)
        self.history: list[list[int]] = [[] for _ in range(n_slots)]  # committed ids per slot
        self.pending: list[list[int] | None] = [None] * n_slots  # last verify input, until commit
        self.salts = [0] * n_slots  # cache_salt_id of the sequence in each slot (the shared one, or its own)
        self._salt = itertools.count(secrets.randbits(48) << 8)  # unique per sequence in this process
        self.shared = EngineBlocks(int(settings.get("tokens_per_block", TOKENS_PER_BLOCK)), next(self._salt),
                                   self._salt)

    @classmethod
    def open(cls, engine_dir: str | Path, settings: dict, n_slots: int,
             free_gpu_memory_fraction: float = 0.85) -> "TrtllmTargetRunner":
        """An Executor over the engine in `engine_dir` with the engine's DFlash outputs registered (all of
        them: every output the engine marks must have a buffer)."""
        versions.require("tensorrt_llm", "the trtllm target runner")
        from tensorrt_llm.bindings import executor as tle

        config = tle.ExecutorConfig(max_beam_width=1, kv_cache_config=tle.KvCacheConfig(
            enable_block_reuse=True, free_gpu_memory_fraction=free_gpu_memory_fraction))
        config.additional_model_outputs = [tle.AdditionalModelOutput(o["name"], o["gather_context"])
                                           for o in settings["outputs"]]
        executor = tle.Executor(Path(engine_dir), tle.ModelType.DECODER_ONLY, config)
        return cls(executor, tle, settings, n_slots)

    @property
    def serves_sampled(self) -> bool:
        return TAIL_LOGITS in self.registered

    # --- executor plumbing --------------------------------------------------------------------
    def _request(self, tokens: list[int], names: list[str], salt: int) -> object:
        tle = self.tle
        outputs = [tle.AdditionalModelOutput(n, self.registered[n]) for n in names]
        try:
            return tle.Request(input_token_ids=tokens, max_tokens=1, streaming=False,
                               sampling_config=tle.SamplingConfig(beam_width=1),
                               output_config=tle.OutputConfig(additional_model_outputs=outputs),
                               cache_salt_id=salt)
        except TypeError as exc:
            raise MissingDependencyError(
                f"this TensorRT-LLM's executor Request has no cache_salt_id ({exc}); the trtllm runner needs "
                f"tensorrt-llm=={versions.TRTLLM_ENGINE_VERSION} (KV-cache salting, 1.1+)") from None

    def _salt_for(self, slot: int, tokens: list[int], need_from: int, fresh: bool = False) -> int:
        """The salt of the slot's request for `tokens`: the shared one while the engine cannot reuse past
        `need_from` (the first position whose engine output the runner needs) under it, else the sequence's own."""
        self.shared.move_on_if_full()
        if fresh:
            self.salts[slot] = self.shared.salt
        retired = self.salts[slot] in self.shared.retired
        if retired or (self.salts[slot] == self.shared.salt and self.shared.reusable(tokens) > need_from):
            self.salts[slot] = next(self._salt)
        if self.salts[slot] == self.shared.salt:
            self.shared.sent(tokens)
        return self.salts[slot]

    def _run(self, inputs: list[list[int]], names: list[list[str]], salts: list[int]) -> list[dict]:
        """One request per input; their additional outputs by result name, in input order."""
        ids = self.executor.enqueue_requests([self._request(t, n, s) for t, n, s in zip(inputs, names, salts)])
        results = []
        for request_id in ids:
            response = self.executor.await_responses(request_id)[-1]
            if response.has_error():
                raise RuntimeError(f"TensorRT-LLM executor: {response.error_msg}")
            results.append({o.name: o.output for o in response.result.additional_outputs})
        return results

    def _names(self, sampled: bool) -> list[str]:
        if sampled and not self.serves_sampled:
            raise ValueError("this trtllm bundle serves greedy requests only (built with runtime.sampled_requests: "
                             "false); send temperature 0 or rebuild with runtime.sampled_requests: true")
        return [TAPS, ACCEPT, *([TAIL_LOGITS] if sampled else [])]

    def _logits(self, out: dict) -> torch.Tensor:  # [K+1, V]
        return output_tensor(out, TAIL_LOGITS, False).to(self.device, torch.float32).view(self.num_drafts + 1, -1)

    def _accept(self, out: dict) -> tuple[int, int, list[int]]:
        return parse_accept(output_tensor(out, ACCEPT, self.registered[ACCEPT]), self.num_drafts)

    def _taps(self, out: dict, prompt_len: int) -> torch.Tensor:  # [promptLen, n*H]
        rows = output_tensor(out, TAPS, True)
        if rows.shape[0] != prompt_len:
            raise CheckpointError(f"context_{TAPS} has {rows.shape[0]} rows for a {prompt_len}-token request")
        return rows.to(self.device).view(prompt_len, -1)

    # --- the contract -------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, slots, prompts, sampling, cached: list[int] | None = None):
        """As the torch runner's: `cached` are each row's first positions whose drafter context the prefix cache
        restored; the taps and positions returned are the rest's."""
        temperature = sampling[0]
        sampled = [bool(t > 0) for t in temperature.tolist()]
        cached = cached or [0] * len(prompts)
        salts = [self._salt_for(slot, list(p), c, fresh=True) for slot, p, c in zip(slots.tolist(), prompts, cached)]
        results = self._run([list(p) for p in prompts], [self._names(s) for s in sampled], salts)
        _, positions, rest = pad_prompts([p[c:] for p, c in zip(prompts, cached)], self.device)
        offsets = torch.tensor(cached, dtype=torch.int64, device=self.device)
        positions, lengths = positions + offsets[:, None], rest + offsets
        taps = torch.zeros(len(prompts), positions.shape[1], self.tap_width, device=self.device)
        first = torch.zeros(len(prompts), dtype=torch.int64, device=self.device)
        for b, (slot, prompt, c, out) in enumerate(zip(slots.tolist(), prompts, cached, results)):
            taps[b, : len(prompt) - c] = self._taps(out, len(prompt))[c:].to(taps.dtype)
            first[b] = self._accept(out)[2][-1]
            self.history[slot], self.pending[slot] = list(prompt), None
        if any(sampled):
            rows = [b for b, s in enumerate(sampled) if s]
            logits = torch.stack([self._logits(results[b])[-1] for b in rows])  # [S, V]
            first[rows] = sample_tokens(logits, lengths[rows], *(p[rows] for p in sampling)).to(first.dtype)
        return first, taps, positions, lengths

    @torch.inference_mode()
    def verify(self, slots, blocks, start, sampling, rows=None):
        """blocks [B, w] (w <= K+1) -> tokens [B, w], accepted [B], taps [B, w, n*H]."""
        width, sampled = blocks.shape[1], [bool(t > 0) for t in sampling[0].tolist()]
        inputs = [block_input(self.history[s], p, row) for s, p, row in
                  zip(slots.tolist(), start.tolist(), blocks.tolist())]
        salts = [self._salt_for(s, tokens, p) for s, tokens, p in zip(slots.tolist(), inputs, start.tolist())]
        results = self._run(inputs, [self._names(s) for s in sampled], salts)
        tokens = torch.zeros(blocks.shape, dtype=torch.int64, device=self.device)
        taps = torch.zeros(blocks.shape[0], width, self.tap_width, device=self.device)
        for b, (slot, first, out) in enumerate(zip(slots.tolist(), start.tolist(), results)):
            _, valid, row_tokens = self._accept(out)
            if valid < width:
                raise RuntimeError(f"the engine recomputed {valid} of the {width} block rows (KV-cache reuse covered "
                                   "part of the block); docs/trtllm-backend.md, open risks")
            tokens[b] = torch.tensor(row_tokens[-width:], device=self.device)
            taps[b] = self._taps(out, len(inputs[b]))[first: first + width].to(taps.dtype)
            self.pending[slot] = inputs[b]
        if any(sampled):
            from dflash_trt.kernels import verify_block

            rows = [b for b, s in enumerate(sampled) if s]
            logits = torch.stack([self._logits(results[b])[-width:] for b in rows])  # [S, w, V]
            tokens[rows] = verify_block(logits, blocks[rows, 1:], start[rows], *(p[rows] for p in sampling))[0]
        return tokens, accept_length(blocks[:, 1:], tokens), taps

    def commit(self, slots, lengths) -> None:
        for slot, length in zip(slots.tolist(), lengths.tolist()):
            source = self.pending[slot] if self.pending[slot] is not None else self.history[slot]
            self.history[slot], self.pending[slot] = source[:length], None

    # --- the prefix cache (runtime/prefix_cache.py): the engine keeps the target's K/V of a cached prefix itself
    # (KV block reuse); the draft runner keeps the drafter's context, and `prefill` takes what it restored
    def prefix_block_bytes(self, block: int) -> int:
        return 0

    def enable_prefix_cache(self, n_blocks: int, block: int) -> None:
        pass

    def save_prefix(self, slot: int, blocks: list[tuple[int, int]]) -> None:
        pass

    def load_prefix(self, slot: int, ids: list[int]) -> None:
        pass

    def shutdown(self) -> None:
        self.executor.shutdown()


def read_engine_config(bundle: str | Path) -> dict:
    path = Path(bundle) / ENGINE_CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; this is not a trtllm bundle (rebuild with backend: trtllm)")
    return json.loads(path.read_text())


def load_trtllm_runners(bundle: str | Path, n_slots: int):
    """(TrtllmTargetRunner, GraphDraftRunner on TensorRT) for a trtllm bundle folder."""
    from dflash_trt.backends.trtllm.draft_runner import trt_draft_runner
    from dflash_trt.backends.trtllm.plugin import register
    from dflash_trt.backends.trtllm.target_model_cls import load_settings

    versions.require("tensorrt_llm", "loading a trtllm bundle")
    versions.require("tensorrt", "loading a trtllm bundle")
    versions.require_engine_route("loading a trtllm bundle")
    bundle = Path(bundle)
    config = read_engine_config(bundle)
    versions.check_recorded(config.get("versions", {}), str(bundle / ENGINE_CONFIG_FILE))
    register(bundle / config["plugin"]["library"])  # before the engine that contains it is deserialized
    target = TrtllmTargetRunner.open(bundle / "target", load_settings(bundle / "target"), n_slots)
    return target, trt_draft_runner(bundle / "draft", n_slots)
