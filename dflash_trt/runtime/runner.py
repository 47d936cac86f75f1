"""The runner contract: what the scheduler calls, and every backend implements.

The scheduler owns requests, slots, lengths, stops and widths; a runner owns tensors and caches. Slots
index static per-slot caches, so rewinding a slot is a length change.

- TargetRunner.prefill(slots, prompts, sampling) -> (first tokens [B], taps [B, T, n*H], positions [B, T],
  lengths [B])
- TargetRunner.verify(slots, blocks [B, K+1], start [B], sampling) -> (tokens [B, K+1], accepted [B],
  taps [B, K+1, n*H]); only tokens[:, :accepted + 1] are specified (a runner may leave later entries
  uncomputed); K = 0 is an autoregressive step
- TargetRunner.commit(slots, lengths [B])
- prefill / verify take `bans=` (token ids banned per row and block row: bad words) on runners whose
  `supports_bad_words` is true; the scheduler refuses bad words on the others
- DraftRunner.append_context(slots, taps, positions, valid): the committed rows' taps (a runner may defer
  storing them to its next draft pass over the same slots)
- DraftRunner.propose(slots, bonus [B], start [B], block_size, sampling) -> drafts [B, K] (K <= block_size - 1;
  a runner may return fewer drafts than asked, e.g. only those its drafter is confident about)
- DraftRunner.commit(slots, lengths [B])

`sampling` is (temperature, top_k, top_p, seed), each [B]. verify and propose also take `rows=` (decoding/batch.py
`Rows`: the rows' slots, first positions and whether any samples, as Python ints the scheduler holds), so a runner
on a GPU never reads a device value back to learn them; a runner may ignore it. Implementations:
backends/torch/runners.py, backends/cpu/runners.py, backends/trtllm/ (runner.py, draft_runner.py).
"""

from __future__ import annotations

from typing import Protocol

import torch

Sampling = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]  # temperature, top_k, top_p, seed [B]


class TargetRunner(Protocol):
    vocab_size: int
    device: torch.device

    def prefill(self, slots, prompts, sampling: Sampling): ...
    def verify(self, slots, blocks, start, sampling: Sampling, rows=None): ...
    def commit(self, slots, lengths): ...


class DraftRunner(Protocol):
    block_size: int

    def append_context(self, slots, taps, positions, valid): ...
    def propose(self, slots, bonus, start, block_size=None, sampling=None, rows=None): ...
    def commit(self, slots, lengths): ...
