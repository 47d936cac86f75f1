"""Static per-slot KV cache; rewind is only a length change.

Layout: k, v are [n_layers, n_slots, n_kv_heads, capacity + 1, head_dim], so a slot's read is a view
in the [B, heads, S, D] layout attention wants; a write is one index_put over (slot, position) pairs.
`lengths[slot]` is the committed length:
positions >= length may hold stale K/V from rejected drafts. The target never reads them (its
mask is causal in absolute positions and writes happen before reads); the drafter masks its
context by `lengths`. API (nanochat's KVCache): `reset`, `advance(n)`, `crop(pos)`, `get_pos`.

A pass that knows its rows on the host (`Rows`: slots, first positions, width) writes and reads without reading
any device value back, so it can run on a GPU without a sync and under a CUDA graph: entries a write must skip go
to one spare position past `capacity` instead of being selected by a boolean mask. Without `Rows` the cache reads
what it needs from the tensors (free on a CPU) and takes the CPU's faster slice copies.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.batch import Rows


class KVCache:
    def __init__(
        self,
        n_layers: int,
        n_slots: int,
        capacity: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        shape = (n_layers, n_slots, n_kv_heads, capacity + 1, head_dim)  # + the spare position skipped writes take
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(n_slots, dtype=torch.int64, device=device)  # [n_slots]
        self.capacity = capacity

    # --- lengths -----------------------------------------------------------------------------
    def reset(self, slots: torch.Tensor | None = None) -> None:
        if slots is None:
            self.lengths.zero_()
        else:
            self.lengths[slots] = 0

    def get_pos(self, slots: torch.Tensor) -> torch.Tensor:
        return self.lengths[slots]

    def advance(self, slots: torch.Tensor, n: torch.Tensor | int) -> None:
        self.lengths[slots] += n

    def crop(self, slots: torch.Tensor, pos: torch.Tensor | int) -> None:
        """Rewind: forget everything at positions >= pos (the DFlash rollback primitive)."""
        self.lengths[slots] = torch.as_tensor(pos, dtype=torch.int64, device=self.lengths.device)

    # --- tensors -----------------------------------------------------------------------------
    def write(
        self,
        layer: int,
        slots: torch.Tensor,  # [B]
        positions: torch.Tensor,  # [B, T]
        k: torch.Tensor,  # [B, T, kv_heads, D]
        v: torch.Tensor,  # [B, T, kv_heads, D]
        valid: torch.Tensor | None = None,  # [B, T] bool: write only these
        end: int | None = None,  # a bound the host knows: every position written is below it
    ) -> None:
        """Store k, v at (slot, position) pairs. Positions must increase along each row (every caller
        passes start + arange), which lets a single row at consecutive positions take a slice copy.
        With `end`, one scatter that reads nothing back (skipped entries land on the spare position)."""
        if end is not None:
            if end > self.capacity:
                raise IndexError(f"KV cache capacity {self.capacity} exceeded (position {end - 1})")
            if valid is not None:
                positions = torch.where(valid, positions, self.capacity)
            index = slots[:, None].expand_as(positions)
            self.k[layer][index, :, positions] = k.to(self.k.dtype)
            self.v[layer][index, :, positions] = v.to(self.v.dtype)
            return
        first, last = int(positions[0, 0]), int(positions.max())
        if last >= self.capacity:
            raise IndexError(f"KV cache capacity {self.capacity} exceeded (position {last})")
        t = positions.shape[1]
        if slots.numel() == 1 and valid is None and last - first == t - 1:
            # one row at consecutive positions (every decode step at batch 1): two slice copies, no scatter
            # (rows are ascending by construction, so first..last spanning t positions means consecutive)
            slot = int(slots[0])
            self.k[layer, slot, :, first : last + 1] = k[0].transpose(0, 1)
            self.v[layer, slot, :, first : last + 1] = v[0].transpose(0, 1)
            return
        rows = slots[:, None].expand_as(positions)
        if valid is not None:
            rows, positions, k, v = rows[valid], positions[valid], k[valid], v[valid]
        # advanced indices around a slice: the indexed dims come first, i.e. [B, T, heads, D] like k
        self.k[layer][rows, :, positions] = k.to(self.k.dtype)
        self.v[layer][rows, :, positions] = v.to(self.v.dtype)

    def read(self, layer: int, slots: torch.Tensor, length: int,
             rows: Rows | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [B, kv_heads, length, D] for positions 0..length-1 of each slot."""
        if rows is not None:
            first = rows.first_slot
            consecutive = first is not None
        else:
            first = int(slots[0])
            consecutive = slots.numel() == 1 or bool((slots[1:] - slots[:-1] == 1).all())
        if consecutive:
            n = slots.numel()
            return self.k[layer, first : first + n, :, :length], self.v[layer, first : first + n, :, :length]
        return self.k[layer, slots, :, :length], self.v[layer, slots, :, :length]


class BlockPool:
    """K/V of fixed-size blocks of positions, kept apart from any slot: a prefix cache's storage.

    Layout: k, v [n_layers, n_blocks, n_kv_heads, block, head_dim], the cache's own per-slot layout cut into
    blocks, so saving a slot's block or restoring it into another slot is one copy per block. Allocated
    empty (untouched pages cost no memory until a block is written).
    """

    def __init__(self, like: KVCache, n_blocks: int, block: int):
        n_layers, _, kv_heads, _, head_dim = like.k.shape
        shape = (n_layers, n_blocks, kv_heads, block, head_dim)
        self.k = torch.empty(shape, dtype=like.k.dtype, device=like.k.device)
        self.v = torch.empty(shape, dtype=like.v.dtype, device=like.v.device)
        self.block = block

    @staticmethod
    def bytes_per_block(like: KVCache, block: int) -> int:
        n_layers, _, kv_heads, _, head_dim = like.k.shape
        return 2 * n_layers * kv_heads * block * head_dim * like.k.element_size()

    def save(self, cache: KVCache, slot: int, blocks: list[tuple[int, int]]) -> None:
        """Copy the slot's positions [i * block, (i + 1) * block) into pool block b, for each (i, b)."""
        for i, b in blocks:
            lo = i * self.block
            self.k[:, b] = cache.k[:, slot, :, lo : lo + self.block]
            self.v[:, b] = cache.v[:, slot, :, lo : lo + self.block]

    def load(self, cache: KVCache, slot: int, ids: list[int]) -> None:
        """Restore pool blocks `ids` as the slot's positions 0 .. len(ids) * block - 1."""
        for i, b in enumerate(ids):
            lo = i * self.block
            cache.k[:, slot, :, lo : lo + self.block] = self.k[:, b]
            cache.v[:, slot, :, lo : lo + self.block] = self.v[:, b]
