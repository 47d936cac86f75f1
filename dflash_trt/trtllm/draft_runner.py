"""`DraftRunner` over the two draft graphs: the same runner drives onnxruntime (CPU) and TensorRT.

The graphs are stateless; this runner owns the draft context cache, in the torch runner's layout
(k, v: [L, n_slots, kv_heads, capacity, D]; `lengths[slot]` = committed context length), so a
rewind is only a length change and slots never move:

- `append_context(slots, taps [B, T, n*H], positions [B, T], valid [B, T])`: the valid rows go
  through `draft_context` as one flat batch; their K/V are written at (slot, position).
- `propose(slots, bonus [B], start [B], block_size=None) -> drafts [B, Q-1]`: the block
  [bonus, MASK x (Q-1)] (Q = block_size, at most the exported one) and the slots' caches up to the
  longest committed length, gathered into contiguous `[L, B, kvh, S, D]`, go to `draft_propose`.
- `commit(slots, lengths [B])`: the committed context length of each slot.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_trt.trtllm.io_spec import DraftGraphSpec
from dflash_trt.trtllm.onnx_export import GRAPH_FILES, TORCH_DTYPES

ENGINE_FILES = {"context": "draft_context.engine", "propose": "draft_propose.engine"}


class GraphDraftRunner:
    def __init__(self, spec: DraftGraphSpec, context_session, propose_session, n_slots: int,
                 block_size: int | None = None):
        self.spec, self.context_session, self.propose_session = spec, context_session, propose_session
        self.block_size = block_size or spec.block_size
        if self.block_size != spec.block_size:
            raise ValueError(f"the draft graphs were exported for block_size {spec.block_size}, not {self.block_size}")
        self.device = context_session.device
        self.dtype = TORCH_DTYPES[spec.float_dtype]
        shape = (spec.num_layers, n_slots, spec.num_kv_heads, spec.capacity, spec.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.lengths = torch.zeros(n_slots, dtype=torch.int64, device=self.device)  # [n_slots]

    @torch.inference_mode()
    def append_context(self, slots, taps, positions, valid) -> None:
        """Write the context K/V of the valid (committed) rows; the caller commits lengths."""
        rows = slots.to(self.device)[:, None].expand_as(positions)[valid]  # [N]
        pos = positions.to(self.device)[valid]  # [N]
        if rows.numel() == 0:
            return
        if int(pos.max()) >= self.spec.capacity:
            raise IndexError(f"draft context capacity {self.spec.capacity} exceeded (position {int(pos.max())})")
        out = self.context_session.run({"target_hidden": taps[valid].to(self.device, self.dtype).contiguous(),
                                        "positions": pos.contiguous()})
        # advanced indices around a slice come first: self.k[:, rows, :, pos] is [N, L, kvh, D]
        self.k[:, rows, :, pos] = out["context_k"].to(self.device, self.dtype).permute(1, 0, 2, 3)
        self.v[:, rows, :, pos] = out["context_v"].to(self.device, self.dtype).permute(1, 0, 2, 3)

    @torch.inference_mode()
    def propose(self, slots, bonus, start, block_size: int | None = None, sampling=None) -> torch.Tensor:
        """drafts [B, Q-1] (int64) for blocks [bonus, MASK x (Q-1)] at positions start..start+Q-1.
        The graphs end in an argmax: sampled rows get greedy drafts here (lossless, fewer accepted than
        the torch runner's coupled drafts); `sampling` is accepted for the runner contract."""
        width = min(block_size or self.block_size, self.block_size)
        slots = slots.to(self.device)
        lengths = self.lengths[slots]  # [B]
        if int(start.max()) + width > self.spec.capacity:
            raise IndexError(f"draft block beyond capacity {self.spec.capacity} (start {int(start.max())})")
        block = torch.full((slots.numel(), width), self.spec.mask_token_id, dtype=torch.int64, device=self.device)
        block[:, 0] = bonus.to(self.device)
        s = max(1, int(lengths.max()))
        out = self.propose_session.run({
            "block_ids": block, "start": start.to(self.device, torch.int64),
            "context_k": self.k[:, slots, :, :s].contiguous(), "context_v": self.v[:, slots, :, :s].contiguous(),
            "context_lengths": lengths.contiguous(),
        })
        return out["drafts"].to(torch.int64)

    def commit(self, slots, lengths) -> None:
        self.lengths[slots.to(self.device)] = lengths.to(self.device, torch.int64)


def ort_draft_runner(folder: str | Path, n_slots: int, threads: int = 1) -> GraphDraftRunner:
    """The draft graphs in `folder` (ONNX + dflash_draft.json) on onnxruntime's CPU provider."""
    from dflash_trt.trtllm.sessions import OrtSession

    folder = Path(folder)
    spec = DraftGraphSpec.load(folder)
    sessions = {name: OrtSession(folder / file, threads) for name, file in GRAPH_FILES.items()}
    return GraphDraftRunner(spec, sessions["context"], sessions["propose"], n_slots)


def trt_draft_runner(folder: str | Path, n_slots: int) -> GraphDraftRunner:
    """The draft engines in `folder` (*.engine + dflash_draft.json) on the current CUDA device."""
    from dflash_trt.trtllm.sessions import TrtSession

    folder = Path(folder)
    spec = DraftGraphSpec.load(folder)
    sessions = {name: TrtSession(folder / file) for name, file in ENGINE_FILES.items()}
    return GraphDraftRunner(spec, sessions["context"], sessions["propose"], n_slots)
