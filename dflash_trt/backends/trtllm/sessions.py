"""Graph sessions with one signature: `run({name: tensor}) -> {name: tensor}` (torch in, torch out).

- `OrtSession`: an ONNX graph on onnxruntime's CPU provider (CI runs the draft graphs this way).
- `TrtSession`: a serialized TensorRT engine on the current CUDA stream, bound to torch tensors
  (`set_input_shape` / `set_tensor_address` / `execute_async_v3`, the pattern of TensorRT-LLM's
  `tensorrt_llm/runtime/session.py` `Session.run`).
- `build_engine(onnx, engine, profile)`: ONNX -> TensorRT engine (strongly typed network: the
  exported dtypes are the engine's; one optimization profile over the symbolic dims).

onnxruntime and tensorrt are imported inside these functions only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from dflash_trt.backends.trtllm.versions import require
from dflash_trt.errors import CheckpointError

TRT_TO_TORCH = {"FLOAT": torch.float32, "HALF": torch.float16, "BF16": torch.bfloat16, "INT64": torch.int64,
                "INT32": torch.int32, "BOOL": torch.bool}


class OrtSession:
    def __init__(self, path: str | Path, threads: int = 1):
        ort = require("onnxruntime", "running the draft graphs on CPU")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.device = torch.device("cpu")

    def run(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        arrays = {name: np.ascontiguousarray(t.detach().cpu().numpy()) for name, t in feeds.items()}
        outputs = self.session.run(self.output_names, arrays)
        return {name: torch.from_numpy(np.asarray(a)) for name, a in zip(self.output_names, outputs)}


class TrtSession:
    def __init__(self, path: str | Path):
        trt = require("tensorrt", "running the draft TensorRT engines")
        self.trt = trt
        self.logger = trt.Logger(trt.Logger.WARNING)
        engine = trt.Runtime(self.logger).deserialize_cuda_engine(Path(path).read_bytes())
        if engine is None:
            raise CheckpointError(f"{path}: TensorRT could not deserialize this engine (built with another "
                                  "TensorRT version or GPU?); rebuild the bundle on this machine")
        self.engine, self.context = engine, engine.create_execution_context()
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self.inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        self.device = torch.device("cuda")

    def _dtype(self, name: str) -> torch.dtype:
        return TRT_TO_TORCH[self.engine.get_tensor_dtype(name).name]

    def run(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        bound = {}
        for name in self.inputs:
            t = feeds[name].to(device=self.device, dtype=self._dtype(name)).contiguous()
            bound[name] = t  # keep alive until the stream is done
            self.context.set_input_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        outputs = {}
        for name in self.outputs:
            shape = tuple(self.context.get_tensor_shape(name))
            outputs[name] = torch.empty(shape, dtype=self._dtype(name), device=self.device)
            self.context.set_tensor_address(name, outputs[name].data_ptr())
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"TensorRT execution failed (inputs {sorted(bound)})")
        return outputs


def build_engine(onnx_path: str | Path, engine_path: str | Path, profile: dict[str, tuple],
                 workspace_bytes: int = 4 << 30) -> Path:
    """Compile an ONNX graph into a TensorRT engine file; `profile`: input -> (min, opt, max) shapes."""
    trt = require("tensorrt", "building the draft TensorRT engines")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise CheckpointError(f"{onnx_path}: TensorRT's ONNX parser failed: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    opt_profile = builder.create_optimization_profile()
    for name, (low, opt, high) in profile.items():
        opt_profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(opt_profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise CheckpointError(f"{onnx_path}: TensorRT failed to build an engine (see the log above)")
    engine_path = Path(engine_path)
    engine_path.write_bytes(bytes(serialized))
    return engine_path
