"""Triton entry point of the `dflash_ar` model: the same bundle decoded autoregressively, the baseline
`dflash-trt bench --url` measures side by side (copied by `dflash-trt publish`; config.pbtxt sets
mode: autoregressive). The class lives in the package (dflash_trt/triton/python_model.py).
"""

from dflash_trt.triton.python_model import TritonPythonModel  # noqa: F401 (Triton looks this name up)
