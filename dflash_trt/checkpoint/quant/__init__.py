"""Quantization for TensorRT-LLM checkpoints: FP8 (e4m3) and NVFP4 (e2m1 + e4m3 block scales).

`numerics` holds the pure-torch primitives (bit-identical to NVIDIA Model Optimizer's exports);
`modes` holds one handler per mode (`none`, `fp8`, `nvfp4`) dispatched from `HANDLERS`.
Nothing here imports the model or the runtime: it maps tensors to tensors.
"""
