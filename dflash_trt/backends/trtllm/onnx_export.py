"""torch -> ONNX for the two draft graphs (the source the draft TensorRT engines are built from).

`export_draft_graphs(draft, target, spec, out_dir)` writes `draft_context.onnx` and
`draft_propose.onnx` with the names and symbolic dims of `io_spec.DraftGraphSpec`, exported by
torch's TorchScript-based exporter (the dynamo exporter needs onnxscript, which we do not ship).
Graphs above 2 GB (an 8B drafter carries copies of the target's embed_tokens and lm_head) get
their weights written as external data files beside the .onnx by the exporter itself.

`aten::rms_norm` has no ONNX symbolic in that exporter; during an export we register one that
decomposes it (x * 1/sqrt(mean(x^2) + eps) * w, in the input dtype: fp32 RMSNorm takes this path
in `model/layers.py`, lower precisions upcast in plain ops first) and remove it afterwards.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from pathlib import Path

import torch

from dflash_trt.backends.trtllm.io_spec import DRAFT_VOCAB_FILE, DraftGraphSpec, TensorSpec
from dflash_trt.backends.trtllm.onnx_graphs import DraftContextGraph, DraftProposeGraph
from dflash_trt.backends.trtllm.versions import require
from dflash_trt.model.draft import DFlashDraft
from dflash_trt.model.target import Target

OPSET = 18
GRAPH_FILES = {"context": "draft_context.onnx", "propose": "draft_propose.onnx"}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "int64": torch.int64, "int32": torch.int32}


def _rms_norm_symbolic(g, x, normalized_shape, weight, eps):
    from torch.onnx import symbolic_helper

    eps_value = symbolic_helper._maybe_get_const(eps, "f")
    eps_value = 1e-6 if eps_value is None or not isinstance(eps_value, float) else eps_value
    square = g.op("Mul", x, x)
    mean = g.op("ReduceMean", square, g.op("Constant", value_t=torch.tensor([-1], dtype=torch.int64)), keepdims_i=1)
    eps_t = g.op("CastLike", g.op("Constant", value_t=torch.tensor(eps_value, dtype=torch.float32)), x)
    inv = g.op("Reciprocal", g.op("Sqrt", g.op("Add", mean, eps_t)))
    return g.op("Mul", g.op("Mul", x, inv), weight)


@contextlib.contextmanager
def rms_norm_symbolic(opset: int = OPSET):
    """Register the aten::rms_norm decomposition for the duration of an export."""
    torch.onnx.register_custom_op_symbolic("aten::rms_norm", _rms_norm_symbolic, opset)
    try:
        yield
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::rms_norm", opset)


def sample_inputs(specs: list[TensorSpec], spec: DraftGraphSpec) -> tuple[torch.Tensor, ...]:
    """Small example tensors for tracing (symbolic dims become distinct small sizes)."""
    sizes = {"num_tokens": 3, "batch": 2, "context_len": 5, "block": spec.block_size}
    out = []
    for t in specs:
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in t.dims)
        dtype = TORCH_DTYPES[t.dtype]
        if dtype.is_floating_point:
            out.append(torch.randn(shape).to(dtype))
        elif t.name == "block_ids":
            out.append(torch.randint(0, spec.vocab_size, shape))
        elif t.name == "context_lengths":
            out.append(torch.full(shape, sizes["context_len"]))
        else:  # positions, start: leave room for the block inside the RoPE table
            out.append(torch.randint(0, max(1, spec.capacity - spec.block_size), shape))
    return tuple(out)


def dynamic_axes(inputs: list[TensorSpec], outputs: list[TensorSpec]) -> dict[str, dict[int, str]]:
    return {t.name: {i: d for i, d in enumerate(t.dims) if isinstance(d, str)} for t in inputs + outputs}


def graph_modules(draft: DFlashDraft, target: Target, spec: DraftGraphSpec) -> dict[str, torch.nn.Module]:
    return {"context": DraftContextGraph(draft, spec.capacity).eval(),
            "propose": DraftProposeGraph(draft, target, spec.capacity, spec.sampled).eval()}


def export_graph(module: torch.nn.Module, io: tuple[list[TensorSpec], list[TensorSpec]], spec: DraftGraphSpec,
                 path: Path, opset: int = OPSET) -> Path:
    inputs, outputs = io
    with torch.inference_mode(False), torch.no_grad(), rms_norm_symbolic(opset), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # legacy-exporter deprecation and tracer notices
        torch.onnx.export(
            module, sample_inputs(inputs, spec), str(path), dynamo=False, opset_version=opset,
            input_names=[t.name for t in inputs], output_names=[t.name for t in outputs],
            dynamic_axes=dynamic_axes(inputs, outputs), do_constant_folding=True,
        )
    stamp_shapes(path, inputs + outputs)
    return path


def stamp_shapes(path: Path, tensors: list[TensorSpec]) -> None:
    """Write the declared dims on the graph's inputs / outputs (the tracer's shape inference can
    leave static dims symbolic); weights stay where the exporter put them (inline or external)."""
    onnx = require("onnx", "exporting the draft graphs")
    model = onnx.load(str(path), load_external_data=False)
    by_name = {t.name: t for t in tensors}
    for value in list(model.graph.input) + list(model.graph.output):
        t = by_name.get(value.name)
        if t is None:
            continue
        for dim, declared in zip(value.type.tensor_type.shape.dim, t.dims):
            if isinstance(declared, str):
                dim.dim_param = declared
            else:
                dim.dim_value = declared
    onnx.save(model, str(path))


def export_draft_graphs(draft: DFlashDraft, target: Target, spec: DraftGraphSpec, out_dir: str | Path,
                        opset: int = OPSET) -> dict[str, Path]:
    """Write draft_context.onnx and draft_propose.onnx (+ the spec, and the draft vocabulary's token ids when
    sampled graphs score one: their logits' columns) into out_dir; returns the paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    modules = graph_modules(draft, target, spec)
    io = {"context": spec.context_io(), "propose": spec.propose_io()}
    paths = {name: export_graph(modules[name], io[name], spec, out_dir / GRAPH_FILES[name], opset) for name in modules}
    spec.save(out_dir)
    if spec.sampled and draft.vocab is not None:
        (out_dir / DRAFT_VOCAB_FILE).write_text(json.dumps({"token_ids": draft.vocab[0].tolist()}) + "\n")
    return paths


def spec_for(draft: DFlashDraft, target: Target, block_size: int, capacity: int, max_batch_size: int,
             dtype: str, sampled: bool = False) -> DraftGraphSpec:
    """The graph spec of a loaded pair (dims from the drafter's config, vocab from the target)."""
    c = draft.config
    d = c.dims
    if block_size > c.block_size:
        from dflash_trt.errors import ConfigError

        raise ConfigError(f"block_size {block_size} exceeds the drafter's trained block_size {c.block_size}")
    return DraftGraphSpec(
        num_layers=d.num_layers, num_kv_heads=d.num_kv_heads, head_dim=d.head_dim, hidden_size=d.hidden_size,
        n_taps=len(c.target_layer_ids), block_size=block_size, capacity=capacity,
        vocab_size=target.config.vocab_size, mask_token_id=c.mask_token_id, dtype=dtype,
        max_batch_size=max_batch_size, target_layer_ids=tuple(c.target_layer_ids), sampled=sampled,
    )
