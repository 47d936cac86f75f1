"""The runner contract (runtime/runner.py) on TensorRT-LLM engines: `TrtllmTargetRunner`.

The target engine (docs/trtllm-backend.md) is driven through TensorRT-LLM 1.2.1's C++ `Executor`
(`tensorrt_llm.bindings.executor`) with "prompt-append" verification: every step sends, per slot,
one request whose input is the slot's committed tokens up to the bonus token plus the drafts
[bonus, d_1 .. d_K], with `max_tokens=1`; KV-cache block reuse recomputes only the block. The
engine's extra outputs carry the DFlashVerify result (`dflash_accept`), the taps of the block rows
(`dflash_tail_taps`), prompt taps at prefill (`dflash_taps`) and, for sampled rows only, the block
logits (`dflash_tail_logits`), verified here by the same kernel (`dflash_trt.kernels.verify_block`).

The runner keeps each slot's committed token ids; `commit(slots, lengths)` truncates them, so a
rewind is a length change as in the torch runner. tensorrt_llm is imported in `__init__` only.
The draft side is `draft_runner.GraphDraftRunner` over TensorRT sessions (`load_trtllm_runners`).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from dflash_trt.decoding.batch import pad_prompts
from dflash_trt.decoding.sampling import sample_tokens
from dflash_trt.decoding.verify import accept_length
from dflash_trt.errors import CheckpointError
from dflash_trt.trtllm import versions
from dflash_trt.trtllm.io_spec import ENGINE_CONFIG_FILE

GREEDY_OUTPUTS = (("dflash_accept", False),)


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


def output_tensor(outputs: dict, name: str) -> torch.Tensor:
    """An additional output by its engine name (the executor prefixes context_ / generation_)."""
    for key in (name, f"generation_{name}", f"context_{name}"):
        if key in outputs:
            value = outputs[key]
            return value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    raise CheckpointError(f"the target engine returned no '{name}' (got {sorted(outputs)}); rebuild the bundle")


class TrtllmTargetRunner:
    def __init__(self, executor, tle, settings: dict, n_slots: int, device="cuda"):
        """`executor`: a tensorrt_llm.bindings.executor.Executor; `tle`: that bindings module."""
        self.executor, self.tle, self.settings = executor, tle, settings
        self.num_drafts, self.vocab_size = settings["num_drafts"], settings["vocab_size"]
        self.tap_width = len(settings["target_layer_ids"]) * settings["hidden_size"]
        self.device = torch.device(device)
        self.history: list[list[int]] = [[] for _ in range(n_slots)]  # committed ids per slot
        self.pending: list[list[int] | None] = [None] * n_slots  # last verify input, until commit

    @classmethod
    def open(cls, engine_dir: str | Path, settings: dict, n_slots: int,
             free_gpu_memory_fraction: float = 0.85) -> "TrtllmTargetRunner":
        """An Executor over the engine in `engine_dir` with the DFlash outputs enabled."""
        versions.require("tensorrt_llm", "the trtllm target runner")
        from tensorrt_llm.bindings import executor as tle

        config = tle.ExecutorConfig(max_beam_width=1, kv_cache_config=tle.KvCacheConfig(
            enable_block_reuse=True, free_gpu_memory_fraction=free_gpu_memory_fraction))
        config.additional_model_outputs = [tle.AdditionalModelOutput(o["name"], o["gather_context"])
                                           for o in settings["outputs"]]
        executor = tle.Executor(Path(engine_dir), tle.ModelType.DECODER_ONLY, config)
        return cls(executor, tle, settings, n_slots)

    # --- executor plumbing --------------------------------------------------------------------
    def _request(self, tokens: list[int], outputs) -> object:
        tle = self.tle
        return tle.Request(input_token_ids=tokens, max_tokens=1, streaming=False,
                           sampling_config=tle.SamplingConfig(beam_width=1),
                           output_config=tle.OutputConfig(additional_model_outputs=[
                               tle.AdditionalModelOutput(name, gather) for name, gather in outputs]))

    def _run(self, inputs: list[list[int]], outputs: list[tuple]) -> list[dict[str, torch.Tensor]]:
        """One request per input; their additional outputs by name, in input order."""
        ids = self.executor.enqueue_requests([self._request(t, o) for t, o in zip(inputs, outputs)])
        results = []
        for request_id in ids:
            response = self.executor.await_responses(request_id)[-1]
            if response.has_error():
                raise RuntimeError(f"TensorRT-LLM executor: {response.error_msg}")
            results.append({o.name: o.output for o in response.result.additional_outputs})
        return results

    def _outputs(self, sampled: bool, prefill: bool) -> list[tuple]:
        extra = [("dflash_taps", True)] if prefill else [("dflash_tail_taps", False)]
        return [*GREEDY_OUTPUTS, *extra, *([("dflash_tail_logits", False)] if sampled else [])]

    def _logits(self, out: dict) -> torch.Tensor:  # [K+1, V]
        return output_tensor(out, "dflash_tail_logits").to(self.device, torch.float32).view(self.num_drafts + 1, -1)

    # --- the contract -------------------------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, slots, prompts, sampling):
        temperature = sampling[0]
        sampled = [bool(t > 0) for t in temperature.tolist()]
        results = self._run([list(p) for p in prompts], [self._outputs(s, True) for s in sampled])
        _, positions, lengths = pad_prompts(prompts, self.device)
        taps = torch.zeros(len(prompts), positions.shape[1], self.tap_width, device=self.device)
        first = torch.zeros(len(prompts), dtype=torch.int64, device=self.device)
        for b, (slot, prompt, out) in enumerate(zip(slots.tolist(), prompts, results)):
            rows = output_tensor(out, "dflash_taps").to(self.device)
            if rows.shape[0] != len(prompt):
                raise RuntimeError(f"prefill got taps for {rows.shape[0]} of {len(prompt)} prompt tokens: KV-cache "
                                   "reuse skipped part of the prompt (docs/trtllm-backend.md, open risks)")
            taps[b, : len(prompt)] = rows.view(len(prompt), -1).to(taps.dtype)
            first[b] = parse_accept(output_tensor(out, "dflash_accept"), self.num_drafts)[2][-1]
            self.history[slot], self.pending[slot] = list(prompt), None
        if any(sampled):
            rows = [b for b, s in enumerate(sampled) if s]
            logits = torch.stack([self._logits(results[b])[-1] for b in rows])  # [S, V]
            first[rows] = sample_tokens(logits, lengths[rows], *(p[rows] for p in sampling)).to(first.dtype)
        return first, taps, positions, lengths

    @torch.inference_mode()
    def verify(self, slots, blocks, start, sampling):
        """blocks [B, w] (w <= K+1) -> tokens [B, w], accepted [B], taps [B, w, n*H]."""
        width, sampled = blocks.shape[1], [bool(t > 0) for t in sampling[0].tolist()]
        inputs = [block_input(self.history[s], p, row) for s, p, row in
                  zip(slots.tolist(), start.tolist(), blocks.tolist())]
        results = self._run(inputs, [self._outputs(s, False) for s in sampled])
        tokens = torch.zeros(blocks.shape, dtype=torch.int64, device=self.device)
        taps = torch.zeros(blocks.shape[0], width, self.tap_width, device=self.device)
        for b, (slot, out) in enumerate(zip(slots.tolist(), results)):
            _, valid, row_tokens = parse_accept(output_tensor(out, "dflash_accept"), self.num_drafts)
            if valid < width:
                raise RuntimeError(f"the engine recomputed {valid} of the {width} block rows (KV-cache reuse covered "
                                   "part of the block); docs/trtllm-backend.md, open risks")
            tokens[b] = torch.tensor(row_tokens[-width:], device=self.device)
            tail = output_tensor(out, "dflash_tail_taps").to(self.device).view(self.num_drafts + 1, -1)
            taps[b] = tail[-width:].to(taps.dtype)
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

    def shutdown(self) -> None:
        self.executor.shutdown()


def read_engine_config(bundle: str | Path) -> dict:
    path = Path(bundle) / ENGINE_CONFIG_FILE
    if not path.is_file():
        raise CheckpointError(f"{path}: missing; this is not a trtllm bundle (rebuild with backend: trtllm)")
    return json.loads(path.read_text())


def load_trtllm_runners(bundle: str | Path, n_slots: int):
    """(TrtllmTargetRunner, GraphDraftRunner on TensorRT) for a trtllm bundle folder."""
    from dflash_trt.trtllm.draft_runner import trt_draft_runner
    from dflash_trt.trtllm.plugin import register
    from dflash_trt.trtllm.target_model_cls import load_settings

    versions.require("tensorrt_llm", "loading a trtllm bundle")
    versions.require("tensorrt", "loading a trtllm bundle")
    bundle = Path(bundle)
    config = read_engine_config(bundle)
    versions.check_recorded(config.get("versions", {}), str(bundle / ENGINE_CONFIG_FILE))
    register(bundle / config["plugin"]["library"])  # before the engine that contains it is deserialized
    target = TrtllmTargetRunner.open(bundle / "target", load_settings(bundle / "target"), n_slots)
    return target, trt_draft_runner(bundle / "draft", n_slots)
