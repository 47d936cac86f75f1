"""The Triton Python-backend model classes the repository models use (`triton_model_repo/*/1/model.py`).

Kept thin on purpose: all logic lives in `orchestrator.Orchestrator`, which gets `pb_utils` passed in
(the module only exists inside the Triton stub), so everything else is importable and testable
anywhere. Needs the dflash-trt package importable by the Python the stub runs (the server's virtualenv).
"""

from __future__ import annotations

import os
import threading
import time


def exit_with_parent(every_s: float = 1.0) -> None:
    """End this stub process when tritonserver (its parent) is gone. A kill -9 of the server left a
    model stub running for hours, holding the bundle's memory (seen in the supervisor's tests): the
    stub's own check did not end it. Reparented (parent pid changed): `os._exit`, nothing to flush."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(every_s)
        os._exit(1)

    threading.Thread(target=watch, name="dflash-parent-watch", daemon=True).start()


class TritonPythonModel:
    def initialize(self, args):
        import triton_python_backend_utils as pb_utils  # only inside the Triton stub

        from dflash_trt.triton.orchestrator import Orchestrator  # here: the ensemble's stub never imports torch

        exit_with_parent()
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

        exit_with_parent()
        self.adapter = EnsembleAdapter(pb_utils, args)

    def execute(self, requests):
        return self.adapter.execute(requests)

    def finalize(self):
        self.adapter.finalize()
