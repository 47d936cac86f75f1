"""Batch plumbing shared by the reference loops and the runners: ragged prompts, prefill, sampling params."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dflash_trt.decoding.bad_words import mask_banned
from dflash_trt.decoding.requests import Request
from dflash_trt.decoding.sampling import params_tensors, sample_tokens


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


def pad_prompts(prompts: list[tuple[int, ...]], device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad ragged prompts -> tokens [B, T], positions [B, T], lengths [B]."""
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64, device=device)
    width = int(lengths.max())
    tokens = torch.zeros(len(prompts), width, dtype=torch.int64, device=device)
    for i, prompt in enumerate(prompts):
        tokens[i, : len(prompt)] = torch.tensor(prompt, dtype=torch.int64)
    positions = torch.arange(width, device=device)[None, :].expand(len(prompts), -1)
    return tokens, positions, lengths


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
