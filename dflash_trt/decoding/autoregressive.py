"""Autoregressive baseline: one target forward per token, same sampling rule, same stops.

This is the ground truth that speculative decoding must reproduce token for token: the reference
loop (reference.py) in pure torch; the engine's own autoregressive mode (a scheduler without a
drafter, runtime/) on each backend.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.bad_words import mask_banned
from dflash_trt.decoding.batch import BatchParams, cache_capacity, prefill
from dflash_trt.decoding.requests import Detokenize, GenerationResult, OnCommit, Request, Row
from dflash_trt.decoding.sampling import sample_tokens


@torch.inference_mode()
def autoregressive_generate(
    target,  # model.Target
    requests: list[Request],
    detokenize: Detokenize | None = None,
    on_commit: OnCommit | None = None,
) -> list[GenerationResult]:
    """Decode a batch of ragged requests token by token; one result per request."""
    device = target.lm_head.weight.device
    rows = [Row(i, r, detokenize) for i, r in enumerate(requests)]
    params = BatchParams.of(requests, device)
    slots = torch.arange(len(requests), device=device)
    cache = target.new_cache(len(requests), cache_capacity(requests, 1))

    # 1) prefill: the prompt's last logits choose the token at position len(prompt)
    last, _, _, position = prefill(target, cache, slots, requests, params)
    for row, token in zip(rows, last.tolist()):
        row.commit([token], on_commit)

    # 2) loop: feed the last token at its position, choose the next one at position + 1
    active_ids = None
    while not all(row.done for row in rows):
        if (ids := [r.index for r in rows if not r.done]) != active_ids:  # a row finished (or the first step)
            active_ids, active = ids, torch.tensor(ids, device=device)
            row_params = params.rows(active)
        logits, _ = target(last[active, None], position[active, None], cache, active)
        mask_banned(logits, [rows[i].request.bans(rows[i].tokens) for i in active_ids])
        chosen = sample_tokens(logits[:, 0], position[active] + 1, *row_params)
        cache.advance(active, 1)
        last[active], position[active] = chosen, position[active] + 1
        for index, token in zip(active.tolist(), chosen.tolist()):
            rows[index].commit([token], on_commit)
    return [row.result() for row in rows]
