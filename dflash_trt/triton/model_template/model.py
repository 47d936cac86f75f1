"""Triton Python-backend entry point of the `dflash` model (rendered by `dflash-trt publish`).

Kept thin on purpose: all logic lives in `dflash_trt.triton.orchestrator`, which needs the
dflash-trt package importable by the Python the backend stub runs (the server's virtualenv).
"""

import triton_python_backend_utils as pb_utils

from dflash_trt.triton.orchestrator import Orchestrator


class TritonPythonModel:
    def initialize(self, args):
        self.orchestrator = Orchestrator(pb_utils, args)

    def execute(self, requests):
        return self.orchestrator.execute(requests)

    def finalize(self):
        self.orchestrator.finalize()
