"""Triton entry point of the `dflash` model: DFlash speculative decoding (copied by `dflash-trt publish`).

The class lives in the package (dflash_trt/triton/python_model.py); its logic in
dflash_trt/triton/orchestrator.py.
"""

from dflash_trt.triton.python_model import TritonPythonModel  # noqa: F401 (Triton looks this name up)
