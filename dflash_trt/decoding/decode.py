"""The reference DFlash speculative decoding loop, in paper order, over a batch of ragged rows.

Each row has its own prompt length, sampling params, seed and acceptance. Per step, every active
row drafts one block in ONE draft pass and verifies it in ONE target pass; rows that stop drop
out of the batch. See `dflash_trt.decoding` for the terms and the lossless contract.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from dflash_trt.decoding.bad_words import mask_banned
from dflash_trt.decoding.batch import BatchParams, cache_capacity, prefill
from dflash_trt.decoding.requests import Detokenize, GenerationResult, OnCommit, Request, Row
from dflash_trt.decoding.verify import verify_lazily
from dflash_trt.decoding.width import AdaptiveWidth, MeasuredWidth, temperature_band
from dflash_trt.kernels import sample_tokens, verify_block  # the rule's switch: torch / C++ twin / CUDA
from dflash_trt.model import cpu_layers
from dflash_trt.model.draft import DFlashDraft
from dflash_trt.model.target import Target


@dataclass
class DecodeTimings:
    prefill_s: float = 0.0
    decode_s: float = 0.0
    steps: int = 0


def banned_rows(rows: list[Row], blocks: torch.Tensor) -> list:
    """Each row's banned ids per verify row of its block [bonus, d_1 ..] (None: no bad words)."""
    return [row.request.bans(row.tokens, block) for row, block in zip(rows, blocks.tolist())]


def merge_context(parts: list[tuple]) -> tuple | None:
    """Deferred contexts (slots, target_hidden [B, T, n*H], positions [B, T], valid [B, T]) of the same slots,
    oldest first, as one (None for none): a draft pass stores them all in one projection per layer. Kept as
    a list while AR steps add to it and joined once here (one cat, not one per step).

    Each part's valid entries are a prefix of its row (a prompt's right padding, a step's rejected drafts);
    joined, they are not (a step's rejected drafts sit between its committed rows and the next step's), so
    each row's valid entries are moved to the front in position order: the one-sequence draft paths read a
    row's context as its valid prefix."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    hidden, positions, valid = (torch.cat(fields, dim=1) for fields in zip(*(part[1:] for part in parts)))
    counts = valid.sum(dim=1)
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices[:, : int(counts.max())]
    hidden = hidden.gather(1, order[..., None].expand(-1, -1, hidden.shape[-1]))
    kept = torch.arange(order.shape[1], device=valid.device)[None, :] < counts[:, None]
    return parts[-1][0], hidden, positions.gather(1, order), kept


def _commit_step(rows: list[Row], active: torch.Tensor, chosen: torch.Tensor, accepted: torch.Tensor,
                 drafts: torch.Tensor, on_commit: OnCommit | None, bonus: torch.Tensor) -> list[int]:
    """Commit each active row's accepted drafts and the target's token after them (the new bonus); the
    accepted counts as a list."""
    accepted_list = accepted.tolist()
    for j, (index, a) in enumerate(zip(active.tolist(), accepted_list)):
        row = rows[index]
        kept = row.commit(chosen[j, : a + 1].tolist(), on_commit)
        row.acceptance_lengths.append(kept)
        row.accepted_drafts.append(a)
        row.draft_tokens += drafts.shape[1]
    bonus[active] = chosen.gather(1, accepted[:, None])[:, 0]
    return accepted_list


def _ar_steps(target: Target, rows: list[Row], active: torch.Tensor, active_ids: list[int], bands: list[int],
              row_params: tuple, bonus: torch.Tensor, start: torch.Tensor, target_cache, draft_cache, pending: list,
              taps, on_commit: OnCommit | None, any_bad_words: bool, width) -> tuple[int, int | None]:
    """Plain AR steps of the active rows (the target's token at each row's next position, its taps kept
    pending as draft context) until a row finishes or the measured policy picks another width (one step
    unless `width` is a MeasuredWidth): the same tokens, K/V and context as one loop iteration per step,
    without a draft step's per-step bookkeeping. -> (steps taken, the width the policy picked for the next
    step; None when it was not asked: a row finished, or no MeasuredWidth)."""
    measured = isinstance(width, MeasuredWidth)
    tokens, positions = bonus[active, None], start[active][:, None]  # [n, 1] each
    committed = torch.ones_like(tokens, dtype=torch.bool)
    none_accepted = [0] * len(active_ids)
    steps, decided = 0, None
    while decided is None:
        t0 = time.perf_counter()
        logits, verify_hidden = target(tokens, positions, target_cache, active, taps)
        if any_bad_words:
            mask_banned(logits, banned_rows([rows[i] for i in active_ids], tokens))
        chosen = sample_tokens(logits[:, 0], positions[:, 0] + 1, *row_params)  # as verify_block picks it
        finished = False
        for index, token in zip(active_ids, chosen.tolist()):
            row = rows[index]
            row.acceptance_lengths.append(row.commit([token], on_commit))
            row.accepted_drafts.append(0)
            finished |= row.done
        target_cache.advance(active, 1)
        pending.append((active, verify_hidden, positions, committed))
        tokens, positions, steps = chosen[:, None], positions + 1, steps + 1
        if not measured:
            break
        width.update(bands, none_accepted, 1, time.perf_counter() - t0)
        if finished:
            break
        if (pick := width.width(bands)) != 1:
            decided = pick
    bonus[active], start[active] = tokens[:, 0], positions[:, 0]
    draft_cache.crop(active, positions[:, 0])
    return steps, decided


@torch.inference_mode()
@cpu_layers.fixed_weights
def speculative_generate(
    target: Target,
    draft: DFlashDraft,
    requests: list[Request],
    block_size: int | None = None,
    detokenize: Detokenize | None = None,
    on_commit: OnCommit | None = None,
    timings: DecodeTimings | None = None,
    width: AdaptiveWidth | MeasuredWidth | None = None,
    min_confidence: float = 0.0,
) -> list[GenerationResult]:
    """DFlash-decode a batch of requests; one result per request (tokens == AR decoding).

    `width` (optional) picks each step's verify width from measured acceptance (decoding/width.py;
    a MeasuredWidth also from the passes' measured seconds, down to plain AR steps of width 1);
    `min_confidence` > 0 verifies only the drafts the drafter trusts (`DFlashDraft.propose`).
    """
    block_size = block_size or draft.config.block_size
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2 (1 bonus + >= 1 draft), got {block_size}")
    timings = timings if timings is not None else DecodeTimings()
    device = target.lm_head.weight.device
    taps = draft.config.target_layer_ids
    mask_token_id = draft.config.mask_token_id
    rows = [Row(i, r, detokenize) for i, r in enumerate(requests)]
    any_bad_words = any(r.bad_words for r in requests)
    params = BatchParams.of(requests, device)
    slots = torch.arange(len(requests), device=device)
    capacity = cache_capacity(requests, block_size)
    target_cache = target.new_cache(len(requests), capacity)
    draft_cache = draft.new_cache(len(requests), capacity)

    # 1) prefill the target; its taps over the prompt become the draft's first context
    t0 = time.perf_counter()
    bonus, target_hidden, positions, start = prefill(target, target_cache, slots, requests, params, taps)
    # the prompt's context waits too: the first draft pass stores it (a request that only ever takes AR steps,
    # hot sampling under measured widths, never pays the drafter for its prompt)
    pending: list[tuple] = [(slots, target_hidden, positions, positions < start[:, None])]
    draft_cache.crop(slots, start)
    for row, token in zip(rows, bonus.tolist()):
        row.commit([token], on_commit)
    timings.prefill_s += time.perf_counter() - t0

    t0 = time.perf_counter()
    # `pending`: committed contexts since the last draft pass, stored by the next one (take_context)
    active_ids, decided = None, None
    while not all(row.done for row in rows):
        if (ids := [r.index for r in rows if not r.done]) != active_ids:  # a row finished (or the first step)
            active_ids, active, decided = ids, torch.tensor(ids, device=device), None
            row_params = params.rows(active)
            bands = [temperature_band(requests[i].params.temperature) for i in active_ids]
        if decided is not None:  # the AR steps before asked the policy already (a second ask would differ)
            step_width, decided = min(decided, block_size), None
        elif isinstance(width, MeasuredWidth):
            step_width = min(width.width(bands), block_size)
        else:
            step_width = min(width.width(), block_size) if width is not None else block_size
        step_width = min(step_width, max(rows[i].remaining for i in active_ids))  # no row commits more
        # an AR step (width 1) keeps the committed context pending: the next draft pass stores it all at once
        keep_pending = step_width == 1 and bool(pending) and torch.equal(pending[-1][0], active)
        # backlog: this draft pass also stores AR steps' context, not just the last step's (as TorchDraftRunner)
        context, backlog = None, len(pending) > 1
        t_draft = time.perf_counter()
        if not keep_pending:
            context, pending = draft.take_context(merge_context(pending), draft_cache, active), []
        block_start = start[active]  # [n] position of each bonus token
        if step_width == 1:  # plain AR steps while the policy keeps width 1: no draft pass (their context waits
            # in `pending`, stored by the next draft pass)
            steps, decided = _ar_steps(target, rows, active, active_ids, bands, row_params, bonus, start, target_cache,
                                       draft_cache, pending, taps, on_commit, any_bad_words, width)
            timings.steps += steps
            continue
        offsets = torch.arange(step_width, device=device)[None, :]  # [1, W]
        block_positions = block_start[:, None] + offsets  # [n, W]

        # 2) draft: [bonus, MASK x K] through the drafter in one pass; greedy proposals, coupled ones for
        #    sampled rows (the sampling rule on the draft's logits with the row's noise, model/draft_heads.py)
        block = torch.full((active.numel(), step_width), mask_token_id, dtype=torch.int64, device=device)
        block[:, 0] = bonus[active]
        drafts = draft.draft_block(target.embed(block), block_positions, draft_cache, active, context,
                                   target.lm_head, min_confidence, row_params, anchor=block[:, 0])  # [n, K']
        block = block[:, : drafts.shape[1] + 1]
        block[:, 1:] = drafts
        block_positions = block_positions[:, : block.shape[1]]
        offsets = offsets[:, : block.shape[1]]

        # 3) verify: the target runs the whole block once and picks its own token everywhere
        bans = banned_rows([rows[i] for i in active_ids], block) if any_bad_words else None
        if bans is not None:  # bad words: every row's logits, masked per row, then the rule
            logits, verify_hidden = target(block, block_positions, target_cache, active, taps)
            chosen, accepted = verify_block(mask_banned(logits, bans), drafts, block_start, *row_params)
        elif device.type == "cpu":  # lm_head only as far as some row's drafts still match
            hidden, verify_hidden = target(block, block_positions, target_cache, active, taps, head=False)
            chosen, accepted = verify_lazily(hidden, target.lm_head, drafts, block_start, *row_params,
                                              verify=verify_block)
        else:
            logits, verify_hidden = target(block, block_positions, target_cache, active, taps)
            chosen, accepted = verify_block(logits, drafts, block_start, *row_params)

        # 4) accept the longest matching prefix plus the target's token after it (the new bonus)
        committed = accepted + 1  # [n]
        accepted_list = _commit_step(rows, active, chosen, accepted, drafts, on_commit, bonus)
        if isinstance(width, MeasuredWidth):  # a backlog step is not this width's steady cost (update)
            spent = time.perf_counter() - t_draft
            width.update(bands, accepted_list, step_width, None if backlog else spent, spent)
        elif width is not None and drafts.shape[1]:
            width.update(accepted_list, drafts.shape[1])

        # 5) rewind: both caches keep exactly the committed positions (bonus + accepted drafts); the
        #    committed rows' taps become draft context in the next draft pass
        target_cache.crop(active, block_start + committed)
        step_context = (active, verify_hidden, block_positions, offsets < committed[:, None])
        pending.append(step_context)
        draft_cache.crop(active, block_start + committed)
        start[active] = block_start + committed
        timings.steps += 1
    timings.decode_s += time.perf_counter() - t0
    return [row.result() for row in rows]
