"""Engine and graph I/O of the trtllm backend, in one place: names, shapes, dtypes, profiles.

The draft graphs (ONNX -> TensorRT) and the target engine's extra outputs are declared here; the
exporter, the TensorRT builder, the runners and `dflash_engine.json` all read these specs, and
CPU tests check the exported graphs and the generated files against them. Dims are ints or
symbolic names (`num_tokens`, `batch`, `context_len`); K = block_size - 1 drafts per block.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dflash_trt.errors import CheckpointError

DRAFT_SPEC_FILE = "dflash_draft.json"
DRAFT_VOCAB_FILE = "dflash_draft_vocab_ids.json"  # graphs scoring a draft vocabulary: its token ids, column order
ENGINE_CONFIG_FILE = "dflash_engine.json"
FLOAT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str  # numpy-style name: float32, bfloat16, int64, int32
    dims: tuple  # ints or symbolic dim names

    def to_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "dims": list(self.dims)}


@dataclass(frozen=True)
class DraftGraphSpec:
    """Everything the draft graphs and their runner need to agree on."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    n_taps: int  # len(target_layer_ids)
    block_size: int  # tokens per noise block: [bonus, MASK x K]
    capacity: int  # positions 0..capacity-1 (rows of the RoPE table)
    vocab_size: int
    mask_token_id: int
    dtype: str  # fp32 | bf16 | fp16: the graphs' float dtype
    max_batch_size: int
    target_layer_ids: tuple[int, ...] = field(default_factory=tuple)
    # graphs for sampled requests (runtime.sampled_requests) also return the draft logits, from which the
    # runner picks coupled drafts for sampled rows (decoding/drafts.py): [B, Q-1, V'] floats a step
    sampled: bool = False

    @property
    def num_drafts(self) -> int:
        return self.block_size - 1

    @property
    def float_dtype(self) -> str:
        return FLOAT_DTYPES[self.dtype]

    def context_io(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        f, kv = self.float_dtype, (self.num_layers, "num_tokens", self.num_kv_heads, self.head_dim)
        inputs = [TensorSpec("target_hidden", f, ("num_tokens", self.n_taps * self.hidden_size)),  # [N, n*H]
                  TensorSpec("positions", "int64", ("num_tokens",))]  # [N]
        return inputs, [TensorSpec("context_k", f, kv), TensorSpec("context_v", f, kv)]  # [L, N, kvh, D]

    def propose_io(self) -> tuple[list[TensorSpec], list[TensorSpec]]:
        f = self.float_dtype
        kv = (self.num_layers, "batch", self.num_kv_heads, "context_len", self.head_dim)  # [L, B, kvh, S, D]
        inputs = [TensorSpec("block_ids", "int64", ("batch", "block")),  # [B, Q]: [bonus, MASK x]
                  TensorSpec("start", "int64", ("batch",)),
                  TensorSpec("context_k", f, kv), TensorSpec("context_v", f, kv),
                  TensorSpec("context_lengths", "int64", ("batch",))]
        outputs = [TensorSpec("drafts", "int64", ("batch", "num_drafts"))]  # [B, Q-1]
        if self.sampled:  # [B, Q-1, V'], V' the draft vocabulary's size (DRAFT_VOCAB_FILE) or the vocabulary's
            outputs.append(TensorSpec("draft_logits", "float32", ("batch", "num_drafts", "draft_vocab")))
        return inputs, outputs

    def dim_ranges(self) -> dict[str, tuple[int, int, int]]:
        """min / opt / max of every symbolic dim (the TensorRT optimization profile)."""
        b = self.max_batch_size
        return {"num_tokens": (1, min(256, b * self.capacity), b * self.capacity),
                "batch": (1, max(1, b // 2), b),
                "block": (2, self.block_size, self.block_size),  # verify width may shrink per step
                "context_len": (1, max(1, self.capacity // 2), self.capacity)}

    def profile(self, graph: str) -> dict[str, tuple[tuple[int, ...], ...]]:
        """input name -> (min shape, opt shape, max shape) for graph 'context' or 'propose'."""
        inputs = (self.context_io() if graph == "context" else self.propose_io())[0]
        ranges = self.dim_ranges()
        return {t.name: tuple(tuple(ranges[d][i] if isinstance(d, str) else d for d in t.dims) for i in range(3))
                for t in inputs}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["target_layer_ids"] = list(self.target_layer_ids)
        d["graphs"] = {name: {"inputs": [t.to_dict() for t in io[0]], "outputs": [t.to_dict() for t in io[1]],
                              "profile": {k: [list(s) for s in v] for k, v in self.profile(name).items()}}
                       for name, io in (("context", self.context_io()), ("propose", self.propose_io()))}
        return d

    def save(self, folder: Path) -> Path:
        path = Path(folder) / DRAFT_SPEC_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, folder: Path) -> "DraftGraphSpec":
        path = Path(folder) / DRAFT_SPEC_FILE
        if not path.is_file():
            raise CheckpointError(f"{path}: missing; rebuild the bundle with `dflash-trt build`")
        data = json.loads(path.read_text())
        data.pop("graphs", None)
        data["target_layer_ids"] = tuple(data.get("target_layer_ids", ()))
        return cls(**data)


DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4, "int64": 8}
# RuntimeBuffers: one set of additional-output buffers per buffer slot, (ctx-gen fusion ? 1 : 2) x micro
# batches; we account for 2 (no fusion, one micro batch at pp 1): an upper bound of what 1.2.1 reserves.
RUNTIME_BUFFER_SETS = 2


@dataclass(frozen=True)
class TargetOutputs:
    """The target engine's outputs beyond the stock `logits` (docs/trtllm-backend.md, target engine).

    How TensorRT-LLM 1.2.1 returns and sizes them (upstream cpp/tensorrt_llm/batch_manager/:
    llmRequest.cpp@89fd9b7 LlmRequest::createResult, utils/inflightBatchingUtils.cpp@a35c38f
    copyAdditionalOutputs, runtimeBuffers.cpp@2a9abd9, trtGptModelInflightBatching.cpp@b35ac1b; and
    cpp/include/tensorrt_llm/batch_manager/llmRequest.h, allocAdditionalOutputs):
    - an output registered with gather_context=True comes back twice, `context_<name>` [promptLen, X]
      (rows from getContextCurrentPosition(): a reused prefix's rows are never written) and
      `generation_<name>` [1, maxNewTokens, X] (the last row); gather_context=False: `generation_<name>` only;
    - every registered output gets a GPU buffer [max_num_tokens, X] per runtime buffer set, allocated
      before the KV cache is sized from the free memory: what is registered shrinks the KV pool.
    So `dflash_tail_logits` ((K+1)·V floats per row) exists only in engines built for sampled requests.
    """

    n_taps: int
    hidden_size: int
    vocab_size: int
    block_size: int
    dtype: str  # model dtype of taps
    sampled: bool = False  # engines for sampled requests also emit the tail block's logits

    def tensors(self) -> list[tuple[TensorSpec, bool]]:
        """(spec, gather_context) of every extra output, in ExecutorConfig order."""
        f, width, nh = FLOAT_DTYPES[self.dtype], self.block_size, self.n_taps * self.hidden_size
        out = [
            (TensorSpec("dflash_taps", f, ("num_tokens", nh)), True),  # [T, n*H] every computed row
            (TensorSpec("dflash_accept", "int32", ("num_requests", 2 + width)), False),  # [R, a, valid, t_0..t_K]
        ]
        if self.sampled:
            out.append((TensorSpec("dflash_tail_logits", "float32", ("num_requests", width * self.vocab_size)), False))
        return out

    def to_list(self) -> list[dict]:
        return [{**t.to_dict(), "gather_context": g} for t, g in self.tensors()]

    def reserved_bytes(self, max_num_tokens: int, buffer_sets: int = RUNTIME_BUFFER_SETS) -> dict[str, int]:
        """GPU bytes the executor reserves at start for each output: buffer_sets x [max_num_tokens, X]."""
        return {t.name: buffer_sets * max_num_tokens * DTYPE_BYTES[t.dtype] * _row(t.dims)
                for t, _ in self.tensors()}


def _row(dims: tuple) -> int:
    n = 1
    for d in dims[1:]:
        n *= d
    return n


def describe_reserved(reserved: dict[str, int]) -> str:
    """'additional outputs reserve 0.34 GB at executor start (dflash_taps 0.34 GB, dflash_accept 0.00 GB)'"""
    parts = ", ".join(f"{name} {n / 1e9:.2f} GB" for name, n in reserved.items())
    return f"additional outputs reserve {sum(reserved.values()) / 1e9:.2f} GB of GPU memory at executor start ({parts})"


def engine_config(draft: DraftGraphSpec, target: TargetOutputs, build_argv: list[str], plugin: dict,
                  versions: dict, family: str) -> dict:
    """The bundle's dflash_engine.json: how the pieces fit, what built them."""
    return {
        "format": "dflash-trt/trtllm-engines",
        "format_version": 1,
        "family": family,
        "block_size": draft.block_size,
        "num_drafts": draft.num_drafts,
        "mask_token_id": draft.mask_token_id,
        "target_layer_ids": list(draft.target_layer_ids),
        "target": {"engine_dir": "target", "trtllm_build_argv": list(build_argv), "extra_outputs": target.to_list()},
        "draft": {"folder": "draft", "spec": DRAFT_SPEC_FILE,
                  "engines": {"context": "draft_context.engine", "propose": "draft_propose.engine"},
                  "onnx": {"context": "draft_context.onnx", "propose": "draft_propose.onnx"}},
        "plugin": plugin,
        "versions": versions,
    }
