"""The Triton Python-backend model classes the repository models use (`triton_model_repo/*/1/model.py`).

Kept thin on purpose: all logic lives in `orchestrator.Orchestrator`, which gets `pb_utils` passed in
(the module only exists inside the Triton stub), so everything else is importable and testable
anywhere. Needs the dflash-trt package importable by the Python the stub runs (the server's virtualenv).
"""

from __future__ import annotations


class TritonPythonModel:
    def initialize(self, args):
        import triton_python_backend_utils as pb_utils  # only inside the Triton stub

        from dflash_trt.triton.orchestrator import Orchestrator  # here: the ensemble's stub never imports torch

        self.orchestrator = Orchestrator(pb_utils, args)

    def execute(self, requests):
        return self.orchestrator.execute(requests)

    def finalize(self):
        self.orchestrator.finalize()


class TritonEnsembleModel:
    """The `ensemble` model: TensorRT-LLM's client conventions forwarded to `dflash` (triton/ensemble.py)."""

    def initialize(self, args):
        import triton_python_backend_utils as pb_utils  # only inside the Triton stub

        from dflash_trt.triton.ensemble import EnsembleAdapter

        self.adapter = EnsembleAdapter(pb_utils, args)

    def execute(self, requests):
        return self.adapter.execute(requests)

    def finalize(self):
        self.adapter.finalize()
