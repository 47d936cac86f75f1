"""The reference DFlash loop, in paper order, over a batch of ragged requests (pure torch).

This is the algorithm as the paper states it, written for reading and for testing: the engine
(runtime/ and the backends) is checked against it token for token, beside plain autoregressive
decoding (autoregressive.py) and z-lab's `dflash_generate`. It has no width policy, no confidence
cut and no backend fast paths: every step drafts a full block (narrowed only where a request has
fewer tokens left) and verifies it with the torch sampling rule. See `dflash_trt.decoding` for the
terms and the lossless contract. `target` and `draft` are `model.Target` / `model.DFlashDraft`.
"""

from __future__ import annotations

import torch

from dflash_trt.decoding.bad_words import mask_banned
from dflash_trt.decoding.batch import BatchParams, cache_capacity, prefill
from dflash_trt.decoding.drafts import propose as propose_drafts
from dflash_trt.decoding.requests import (
    Detokenize,
    GenerationResult,
    OnCommit,
    Request,
    Row,
)
from dflash_trt.decoding.verify import verify_block


@torch.inference_mode()
def speculative_generate(
    target,
    draft,
    requests: list[Request],
    block_size: int | None = None,
    detokenize: Detokenize | None = None,
    on_commit: OnCommit | None = None,
    propose=propose_drafts,
) -> list[GenerationResult]:
    """DFlash-decode a batch of requests; one result per request (tokens == autoregressive decoding).
    `propose`: the proposal rule (decoding/drafts.py `propose`; tests pass scripted drafters')."""
    block_size = block_size or draft.config.block_size
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2 (1 bonus + >= 1 draft), got {block_size}")
    device = target.lm_head.weight.device
    rows = [Row(i, r, detokenize) for i, r in enumerate(requests)]
    params = BatchParams.of(requests, device)
    slots = torch.arange(len(requests), device=device)
    capacity = cache_capacity(requests, block_size)
    target_cache, draft_cache = target.new_cache(len(requests), capacity), draft.new_cache(len(requests), capacity)
    taps, mask_token_id = draft.config.target_layer_ids, draft.config.mask_token_id

    # 1) prefill: the prompt's last logits choose the first token (the bonus token of the first block);
    #    the prompt's target_hidden becomes the drafter's context
    bonus, target_hidden, positions, start = prefill(target, target_cache, slots, requests, params, taps)
    draft.append_context(target_hidden, positions, draft_cache, slots, positions < start[:, None])
    draft_cache.crop(slots, start)
    for row, token in zip(rows, bonus.tolist()):
        row.commit([token], on_commit)

    while not all(row.done for row in rows):
        live = [row for row in rows if not row.done]
        active = torch.tensor([row.index for row in live], device=device)
        sampling = params.rows(active)
        width = min(block_size, max(row.remaining for row in live))  # no row commits more than it may
        begin = start[active]  # [n] position of each bonus token
        offsets = torch.arange(width, device=device)[None, :]
        block_positions = begin[:, None] + offsets  # [n, W]
        block = torch.full((len(live), width), mask_token_id, dtype=torch.int64, device=device)
        block[:, 0] = bonus[active]

        # 2) draft: [bonus, MASK x K] through the drafter in ONE pass; its slots 1..K propose the drafts
        if width > 1:
            hidden = draft(target.embed(block), block_positions, draft_cache, active)  # [n, W, H]
            block[:, 1:] = propose(draft, hidden[:, 1:], target.lm_head, begin, sampling, anchor=block[:, 0])

        # 3) verify: the target runs the whole block in ONE pass and picks its own token at every row
        logits, target_hidden = target(block, block_positions, target_cache, active, taps)
        if any(row.request.bad_words for row in live):
            mask_banned(logits, [row.request.bans(row.tokens, b) for row, b in zip(live, block.tolist())])
        tokens, accepted = verify_block(logits, block[:, 1:], begin, *sampling)  # [n, W], [n]

        # 4) accept the longest matching prefix of drafts plus the target's token after it (the new bonus)
        for row, row_tokens, a in zip(live, tokens.tolist(), accepted.tolist()):
            row.acceptance_lengths.append(row.commit(row_tokens[: a + 1], on_commit))
            row.accepted_drafts.append(a)
            row.draft_tokens += width - 1
        committed = accepted + 1
        bonus[active] = tokens.gather(1, accepted[:, None])[:, 0]
        start[active] = begin + committed

        # 5) rewind: both caches keep exactly the committed positions; the committed rows' target_hidden
        #    becomes the drafter's context for the next block
        target_cache.crop(active, begin + committed)
        draft.append_context(target_hidden, block_positions, draft_cache, active, offsets < committed[:, None])
        draft_cache.crop(active, begin + committed)
    return [row.result() for row in rows]
