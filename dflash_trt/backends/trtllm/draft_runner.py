"""`DraftRunner` over the two draft graphs: the same runner drives onnxruntime (CPU) and TensorRT.

The graphs are stateless; this runner owns the draft context cache, in the torch runner's layout
(k, v: [L, n_slots, kv_heads, capacity, D]; `lengths[slot]` = committed context length), so a
rewind is only a length change and slots never move:

- `append_context(slots, taps [B, T, n*H], positions [B, T], valid [B, T])`: the valid rows go
  through `draft_context` as one flat batch; their K/V are written at (slot, position).
- `propose(slots, bonus [B], start [B], block_size=None, sampling=None) -> drafts [B, Q-1]`: the block
  [bonus, MASK x (Q-1)] (Q = block_size, at most the exported one) and the slots' caches up to the
  longest committed length, gathered into contiguous `[L, B, kvh, S, D]`, go to `draft_propose`. Its
  drafts are the argmax; graphs exported for sampled requests (`DraftGraphSpec.sampled`) also return
  the draft logits, and sampled rows then get coupled drafts from them — the sampling rule with the
  request's own noise, `coupled_drafts`, as the torch runner picks them (decoding/drafts.py).
- `commit(slots, lengths [B])`: the committed context length of each slot.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_trt.backends.trtllm.io_spec import DRAFT_VOCAB_FILE, DraftGraphSpec
from dflash_trt.backends.trtllm.onnx_export import GRAPH_FILES, TORCH_DTYPES
from dflash_trt.decoding.drafts import any_sampled, coupled_drafts
from dflash_trt.model.kv_cache import BlockPool

ENGINE_FILES = {"context": "draft_context.engine", "propose": "draft_propose.engine"}


class GraphDraftRunner:
    def __init__(self, spec: DraftGraphSpec, context_session, propose_session, n_slots: int,
                 block_size: int | None = None, vocab_ids: torch.Tensor | None = None):
        """`vocab_ids` [V']: the token id of each draft-logits column, when the graphs score a draft vocabulary."""
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
        self.vocab_ids = None if vocab_ids is None else vocab_ids.to(self.device)

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
    def propose(self, slots, bonus, start, block_size: int | None = None, sampling=None, rows=None) -> torch.Tensor:
        """drafts [B, Q-1] (int64) for blocks [bonus, MASK x (Q-1)] at positions start..start+Q-1: the argmax,
        and for the rows of `sampling` (T, top_k, top_p, seed [B]) with T > 0 coupled drafts when the graphs
        return logits (`spec.sampled`); graphs for greedy requests only give every row its argmax (lossless:
        verification decides, a greedy draft is just accepted less often against a sampled target)."""
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
        drafts = out["drafts"].to(torch.int64)
        if self.spec.sampled and any_sampled(sampling):
            rows = (sampling[0] > 0).nonzero()[:, 0].to(self.device)
            logits = out["draft_logits"].to(self.device, torch.float32)[rows]  # [n, Q-1, V']
            params = tuple(p.to(self.device)[rows] for p in sampling)
            columns = coupled_drafts(logits, start.to(self.device)[rows], params, self.vocab_ids)
            drafts[rows] = columns if self.vocab_ids is None else self.vocab_ids[columns]
        return drafts

    def commit(self, slots, lengths) -> None:
        self.lengths[slots.to(self.device)] = lengths.to(self.device, torch.int64)

    # --- the prefix cache (runtime/prefix_cache.py): the drafter's context K/V of cached blocks, in a block pool
    def prefix_block_bytes(self, block: int) -> int:
        return BlockPool.bytes_per_block(self, block)

    def enable_prefix_cache(self, n_blocks: int, block: int) -> None:
        self.pool = BlockPool(self, n_blocks, block)

    def save_prefix(self, slot: int, blocks: list[tuple[int, int]]) -> None:
        self.pool.save(self, slot, blocks)

    def load_prefix(self, slot: int, ids: list[int]) -> None:
        self.pool.load(self, slot, ids)

    def stored_length(self, slot: int) -> int:
        """Positions 0 .. n-1 of the slot hold final context K/V (context is stored as it comes)."""
        return int(self.lengths[slot])


def ort_draft_runner(folder: str | Path, n_slots: int, threads: int = 1) -> GraphDraftRunner:
    """The draft graphs in `folder` (ONNX + dflash_draft.json) on onnxruntime's CPU provider."""
    from dflash_trt.backends.trtllm.sessions import OrtSession

    folder = Path(folder)
    spec = DraftGraphSpec.load(folder)
    sessions = {name: OrtSession(folder / file, threads) for name, file in GRAPH_FILES.items()}
    return GraphDraftRunner(spec, sessions["context"], sessions["propose"], n_slots, vocab_ids=vocab_ids(folder))


def trt_draft_runner(folder: str | Path, n_slots: int) -> GraphDraftRunner:
    """The draft engines in `folder` (*.engine + dflash_draft.json) on the current CUDA device."""
    from dflash_trt.backends.trtllm.sessions import TrtSession

    folder = Path(folder)
    spec = DraftGraphSpec.load(folder)
    sessions = {name: TrtSession(folder / file) for name, file in ENGINE_FILES.items()}
    return GraphDraftRunner(spec, sessions["context"], sessions["propose"], n_slots, vocab_ids=vocab_ids(folder))


def vocab_ids(folder: Path) -> torch.Tensor | None:
    """The draft vocabulary's token ids [V'] (the draft logits' columns) of sampled graphs that score one."""
    import json

    path = Path(folder) / DRAFT_VOCAB_FILE
    if not path.is_file():
        return None
    return torch.tensor(json.loads(path.read_text())["token_ids"], dtype=torch.int64)
