"""Backends: siblings behind the runner contract (runtime/runner.py).

- `torch`: the models' own torch forwards on any device (CUDA first), with the verification body the
  kernels' switch picks (dflash_trt/kernels): the CUDA kernel where its op is built, else torch.
- `cpu`: the same models on CPU through one C++ call per decoder layer, the heads' panels, the lazy
  verify and the one-call draft step (bit-exact passes: a verify row is a decode row).
- `trtllm`: TensorRT-LLM engines (route A, paired engines) and the llmapi export (route B).

A backend implements `TargetRunner` / `DraftRunner` and, for bundles, the build contract
(engine/backend.py). `runtime/backends.py` is the one module that names them; nothing below the
runtime picks one.
"""
