"""The runner contract on CPU: the torch runners with their passes through the C++ layer.

- target passes: `target.forward` (C++ layers, pieces past `layers.MAX_ROWS` rows, the head's panels);
  a verify step without bad words runs the head lazily (`target.verify_lazily`): only as far as some row's drafts
  still match, one sequence wholly in C++;
- draft passes: `draft.draft_block` (one C++ call for a request alone; C++ layers for batches).
A server's weights do not change, so each runner checks its layers' tensors once, not every pass
(`layers.weights_fixed_in`).
"""

from __future__ import annotations

import torch

from dflash_trt.backends.cpu import draft as cpu_draft
from dflash_trt.backends.cpu import layers
from dflash_trt.backends.cpu import target as cpu_target
from dflash_trt.backends.torch.runners import TorchDraftRunner, TorchTargetRunner


class CpuTargetRunner(TorchTargetRunner):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._fixed: dict = {}

    def forward(self, tokens, positions, slots, logit_rows=None, head: bool = True, rows=None):
        with layers.weights_fixed_in(self._fixed):
            return cpu_target.forward(self.target, tokens, positions, self.cache, slots, self.tap_layers, logit_rows,
                                      head)

    @torch.inference_mode()
    def verify(self, slots: torch.Tensor, blocks: torch.Tensor, start: torch.Tensor, sampling, bans=None, rows=None):
        if blocks.shape[1] == 1 or bans is not None:
            return super().verify(slots, blocks, start, sampling, bans)
        positions = start[:, None] + torch.arange(blocks.shape[1])[None, :]
        hidden, taps = self.forward(blocks, positions, slots, head=False)
        tokens, accepted = cpu_target.verify_lazily(hidden, self.target.lm_head, blocks[:, 1:], start, sampling,
                                         self.kernels.verify_block, self.kernels.name == "twin")
        return tokens, accepted, taps


class CpuDraftRunner(TorchDraftRunner):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._fixed: dict = {}

    def draft_block(self, noise_embedding, positions, slots, context, sampling, anchor, rows=None) -> torch.Tensor:
        with layers.weights_fixed_in(self._fixed):
            return cpu_draft.draft_block(self.draft, noise_embedding, positions, self.cache, slots, context,
                                         self.target.lm_head, self.min_confidence, sampling, anchor,
                                         self.kernels.sample_tokens, self.kernels.name == "twin")
