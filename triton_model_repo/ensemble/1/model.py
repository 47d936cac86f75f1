"""Triton entry point of the `ensemble` model: TensorRT-LLM's client names over `dflash` (copied by `dflash-trt publish`).

The class lives in the package (dflash_trt/triton/python_model.py); its logic in
dflash_trt/triton/ensemble.py.
"""

from dflash_trt.triton.python_model import TritonEnsembleModel as TritonPythonModel  # noqa: F401 (Triton looks this name up)
