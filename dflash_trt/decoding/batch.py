"""Batch plumbing shared by the reference loops and the runners: ragged prompts, prefill, sampling params."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_trt.decoding.bad_words import mask_banned
from dflash_trt.decoding.requests import Request
from dflash_trt.decoding.sampling import params_tensors, sample_tokens


@dataclass(frozen=True)
class Rows:
    """What the host already knows about a pass's rows: each row's cache slot and first position, how many positions
    each writes, and whether any row samples. With it a pass never reads a device value back to learn them: on a
    GPU each such read is a sync that drains the launch queue, and none may happen inside a CUDA graph."""

    slots: tuple[int, ...]
    starts: tuple[int, ...]  # the first position each row writes
    width: int = 1  # positions each row writes: starts[i] .. starts[i] + width - 1
    sampled: bool = False  # some row has temperature > 0
    keys: int | None = None  # keys the pass reads when fixed ahead (>= end: a CUDA graph's bucket), else `end`

    @property
    def end(self) -> int:
        """The furthest row's last position + 1."""
        return max(self.starts) + self.width

    @property
    def read_end(self) -> int:
        """Keys the pass reads: positions 0 .. read_end - 1 (those past a row's own are masked)."""
        return self.keys if self.keys is not None else self.end

    @property
    def uniform(self) -> bool:
        """Every key the pass reads is every row's: rows start at the same position and nothing is read past."""
        return len(set(self.starts)) == 1 and self.read_end == self.end

    @property
    def first_slot(self) -> int | None:
        """The first slot when the slots are one ascending run (a cache read is then a view), else None."""
        first = self.slots[0]
        return first if self.slots == tuple(range(first, first + len(self.slots))) else None


@dataclass
class BatchParams:
    """Per-row sampling tensors, indexable by the active rows."""

    temperature: torch.Tensor  # [B] fp32
    top_k: torch.Tensor  # [B] int64
    top_p: torch.Tensor  # [B] fp32
    seed: torch.Tensor  # [B] int64

    @classmethod
    def of(cls, requests: list[Request], device) -> "BatchParams":
        return cls(*params_tensors([r.params for r in requests], device))

    def rows(self, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.temperature[index], self.top_k[index], self.top_p[index], self.seed[index]


def to_device(values, device) -> torch.Tensor:
    """Host values (a tensor, or nested lists of ints) on `device`; to a GPU through pinned memory without waiting
    (a plain copy to the device waits for the stream, a sync)."""
    host = values if isinstance(values, torch.Tensor) else torch.tensor(values, dtype=torch.int64)
    if torch.device(device).type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


class StepInputs:
    """Device tensors of step inputs that repeat from step to step, kept so that a repeat copies nothing: one slots
    tensor per set of slots (a draft runner then knows its pending context's slots by identity, without reading
    the device), and the sampling tensors of the last set of requests."""

    def __init__(self, device):
        self.device = device
        self._slots: dict[tuple[int, ...], torch.Tensor] = {}
        self._sampling: tuple = ((), ())

    def slots(self, slots: tuple[int, ...]) -> torch.Tensor:
        if slots not in self._slots:
            self._slots[slots] = to_device(torch.tensor(slots, dtype=torch.int64), self.device)
        return self._slots[slots]

    def sampling(self, key: tuple, params: list) -> tuple[torch.Tensor, ...]:
        """(temperature, top_k, top_p, seed) of `params`; `key` names the requests (the same key: the same tensors)."""
        if self._sampling[0] != key:
            self._sampling = (key, tuple(to_device(t, self.device) for t in params_tensors(params)))
        return self._sampling[1]


def pad_prompts(prompts: list[tuple[int, ...]], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad ragged prompts -> tokens [B, T], positions [B, T], lengths [B]."""
    width = max(len(p) for p in prompts)
    tokens = torch.zeros(len(prompts), width, dtype=torch.int64)  # built on the host, copied once
    for i, prompt in enumerate(prompts):
        tokens[i, : len(prompt)] = torch.tensor(prompt, dtype=torch.int64)
    lengths = to_device(torch.tensor([len(p) for p in prompts], dtype=torch.int64), device)
    positions = torch.arange(width, device=device)[None, :].expand(len(prompts), -1)
    return to_device(tokens, device), positions, lengths


@torch.inference_mode()
def prefill(
    target,  # model.Target
    cache,  # its KVCache
    slots: torch.Tensor,  # [B]
    requests: list[Request],
    params: BatchParams,
    tap_layers: tuple[int, ...] = (),
):
    """Run the prompts; -> first tokens [B], target_hidden [B, T, n*H] | None, positions, lengths.

    The first generated token sits at absolute position len(prompt) and is chosen by the rule.
    Padding writes stale K/V past each prompt; they are overwritten before any query sees them.
    """
    tokens, positions, lengths = pad_prompts([r.prompt for r in requests], slots.device)
    logits, target_hidden = target(tokens, positions, cache, slots, tap_layers, logit_rows=(lengths - 1)[:, None])
    cache.crop(slots, lengths)
    index = torch.arange(len(requests), device=slots.device)
    mask_banned(logits, [r.bans([]) for r in requests])
    first = sample_tokens(logits[:, 0], lengths, *params.rows(index))
    return first, target_hidden, positions, lengths


def cache_capacity(requests: list[Request], block_size: int) -> int:
    """Positions a decode can touch: longest prompt + budget + one block of drafts."""
    return max(len(r.prompt) + r.stop.max_new_tokens for r in requests) + block_size + 1
