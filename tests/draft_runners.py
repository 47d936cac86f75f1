"""Draft-runner wrappers shared by the ONNX-draft and TensorRT-LLM-runner tests (not a test module)."""


class GreedyDrafts:
    """A torch draft runner proposing greedy drafts for every row, as the ONNX graphs do."""

    def __init__(self, runner):
        self.runner = runner

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def propose(self, *args, rows=None):
        return self.runner.propose(*args[:4])
