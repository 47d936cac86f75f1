"""The drafter's passes on CPU: `DFlashDraft.forward` and proposals through the C++ layer and heads.

- One sequence whose new context is the run of positions right before its block (every decode step of
  a request alone) drafts in ONE C++ call (`layers.DraftStep`): context features (fc through its panels,
  norm), every layer over [context ; block], the final norm and the head — greedy drafts, or coupled
  ones picked by the sampling rule's C++ twin — with the confidence cut reading the last layer's rows
  lazily. Its numbers equal the separate calls'.
- Other batches of full-attention drafters run their layers through the C++ layer (ragged contexts as
  counts), then propose in torch with the head's panels and the twin's rule.
- Everything else (causal layers, DFlash2's convolutions, hooks) is the module's own torch forward.
  Sliding-window layers run in C++ too: a query reads only the keys its window shows, so a draft pass
  costs the same at any context length.
"""

from __future__ import annotations

import torch

from dflash_trt.backends.cpu import layers, ops
from dflash_trt.backends.cpu.target import head_logits, norm
from dflash_trt.decoding import drafts as proposals
from dflash_trt.decoding.drafts import CONFIDENCE_FIRST, DraftOps, any_sampled


def full_attention(draft) -> bool:
    """Every layer non-causal (a sliding window or none), and no DFlash2 convolution: what the C++ layer
    implements."""
    return draft.candidate_selector is None and all(not layer.is_causal for layer in draft.layers)


def plain_head(draft) -> bool:
    """No output multiplier or softcap: the C++ heads pick from the raw logits."""
    return draft.config.output_multiplier == 1.0 and not draft.config.final_logit_softcapping


def draft_ops(sample) -> DraftOps:
    """Proposal ops on CPU: the head's panels, `sample` (the kernels' rule), the C++ trust."""
    def log_trust(logits, columns, temperature):
        out = ops.sampled_trust(logits, columns, temperature)
        return out if out is not None else DraftOps().log_trust(logits, columns, temperature)

    return DraftOps(head=head_logits, sample=sample, log_trust=log_trust)


def forward(draft, noise_embedding, block_positions, cache, slots, context=None) -> torch.Tensor:
    """`DFlashDraft.forward` -> [B, Q, H] after the draft norm, through the C++ layer where it applies."""
    x = draft.block_input(noise_embedding)
    b = x.shape[0]
    if full_attention(draft) and layers.eligible(block_positions, cache) and (plans := layers.plans(draft.layers)):
        if b == 1 and (args := _one_sequence_args(draft, x, context, block_positions, cache, slots)) is not None:
            layers.run_layers(plans, *args, causal=False)
            return norm(draft.norm, args[0].view(1, x.shape[1], -1))
        rows = _context_rows(draft, context, block_positions)
        if rows is not None:
            return norm(draft.norm, _layers_cpu(plans, x, *rows, block_positions, draft.rotary, cache, slots))
    return draft(noise_embedding, block_positions, cache, slots, context)


def draft_block(draft, noise_embedding, block_positions, cache, slots, context, lm_head, min_confidence: float,
                sampling, anchor, sample, twin: bool) -> torch.Tensor:
    """Drafts [B, K' <= K] of block slots 1..K: one C++ call for one sequence where it applies, else
    `forward` then `propose`. `sample` is the sampling rule's body the kernels' switch picked; `twin`: it is
    the C++ twin, which the C++ heads can call too."""
    drafts = _one_call_drafts(draft, noise_embedding, block_positions, cache, slots, context, lm_head,
                              min_confidence, sampling, twin)
    if drafts is not None:
        return drafts
    hidden = forward(draft, noise_embedding, block_positions, cache, slots, context)[:, 1:]
    return propose(draft, hidden, lm_head, block_positions[:, 0], sampling, anchor, min_confidence, sample)


def propose(draft, hidden, lm_head, start, sampling, anchor, min_confidence: float, sample) -> torch.Tensor:
    """`decoding.drafts.propose` on CPU: one greedy sequence's head and cut in C++, the rest with the CPU ops."""
    if not any_sampled(sampling) and draft.candidate_selector is None and plain_head(draft):
        ids, head = (None, lm_head) if draft.vocab is None else draft.vocab
        if ops.head_ready(hidden, head):
            columns = ops.greedy_drafts(hidden[0], head, min_confidence, CONFIDENCE_FIRST)[None]
            return columns if ids is None else ids[columns]
    return proposals.propose(draft, hidden, lm_head, start, sampling, anchor, min_confidence, draft_ops(sample))


def _one_call_drafts(draft, noise_embedding, block_positions, cache, slots, context, lm_head,
                     min_confidence: float, sampling, twin: bool) -> torch.Tensor | None:
    """`draft_block` for one sequence through `layers.DraftStep`, or None where it does not apply: its
    context must be the run of positions right before its block, and a sampled row's rule the C++ twin."""
    b, q = block_positions.shape
    if not (b == 1 and full_attention(draft) and plain_head(draft) and layers.eligible(block_positions, cache)):
        return None
    sampled = any_sampled(sampling)
    if sampled and not twin:
        return None
    rule = ops.twin_rule(sampling) if sampled else None
    plans = layers.plans(draft.layers)
    ids, head = (None, lm_head) if draft.vocab is None else draft.vocab
    step = None if plans is None else layers.DraftStep.of(draft, plans, draft.fc, draft.hidden_norm, draft.norm,
                                                          head, ids, CONFIDENCE_FIRST)
    start = int(block_positions[0, 0])
    if step is None or (new := _one_sequence_context(context, start)) is None:
        return None
    n, target_hidden = new
    if target_hidden is not None:
        target_hidden = target_hidden.to(draft.fc.weight.dtype).contiguous()
    x = draft.block_input(noise_embedding).reshape(q, -1).contiguous()
    cos, sin = draft.rotary.rows(start - n, n + q, x.dtype)
    return step(x, target_hidden, cos, sin, cache, int(slots[0]), start, min_confidence, rule)[None]


def _one_sequence_context(context, start: int) -> tuple[int, torch.Tensor | None] | None:
    """(n, target_hidden [n, n_taps*H] or None) of one sequence's new context, which must be the run of
    positions right before its block at `start`; None otherwise. (Positions are read once as a list.)"""
    if context is None:
        return 0, None
    hidden, ctx_positions, ctx_valid = context
    n = hidden.shape[1] if ctx_valid is None else int(ctx_valid.sum())  # one row: its valid rows are a prefix
    if not n:
        return 0, None
    ctx = ctx_positions[0, :n].tolist()
    if ctx[0] + n != start or ctx[-1] != start - 1:
        return None
    return n, hidden[0, :n]


def _context_features(draft, target_hidden: torch.Tensor) -> torch.Tensor:
    """`DFlashDraft.context_features` of one sequence's rows [T, n*H]: fc through its panels, the C++ norm."""
    x = target_hidden.to(draft.fc.weight.dtype).contiguous()
    projected = ops.head_matmul(x, draft.fc)
    if projected is None:
        return draft.context_features(target_hidden).contiguous()
    return norm(draft.hidden_norm, projected)


def _one_sequence_args(draft, x, context, block_positions, cache, slots) -> tuple | None:
    """`run_layers` arguments (x ... sin, x a copy) for one sequence whose context is the run of positions
    right before its block; None otherwise."""
    start, width = int(block_positions[0, 0]), x.shape[1]
    if (new := _one_sequence_context(context, start)) is None:
        return None
    n, target_hidden = new
    features = None if target_hidden is None else _context_features(draft, target_hidden)
    counts = None if target_hidden is None else torch.tensor([n], dtype=torch.int32)
    x = x.reshape(width, -1).clone()  # updated in place
    cos, sin = draft.rotary.rows(start - n, n + width, x.dtype)
    return x, features, counts, cache, slots.to(torch.int64).contiguous(), torch.tensor([start - n]), cos, sin


def _context_rows(draft, context, block_positions) -> tuple | None:
    """A batch's context as the C++ layer takes it: features [sum C_b, H] and counts [B] (int32), or (None,
    None) without context; None when a row's context is not the run of positions right before its block."""
    if context is None:
        return None, None
    hidden, positions, valid = context
    b, c, _ = hidden.shape
    if valid is None:
        counts = torch.full((b,), c, dtype=torch.int64)
    else:
        counts = valid.sum(dim=1)
        if not torch.equal(valid, torch.arange(c)[None, :] < counts[:, None]):
            return None
    if c:
        steps = positions[:, 1:] - positions[:, :-1] == 1  # consecutive, where valid
        if valid is not None:
            steps |= ~valid[:, 1:]
        if not (torch.equal(positions[:, 0] + counts, block_positions[:, 0]) and bool(steps.all())):
            return None
    features = draft.context_features(hidden)
    features = features.reshape(b * c, -1) if valid is None else features[valid]
    return features.contiguous(), counts.to(torch.int32)


def _layers_cpu(plans, x, features, counts, block_positions, rotary, cache, slots) -> torch.Tensor:
    """All draft layers through the C++ layer -> [B, Q, H]; features [sum C_b, H] and counts [B] are each
    row's context (None: none), right before its block."""
    b, q, _ = x.shape
    x = x.reshape(b * q, -1).clone()  # [B*Q, H], updated in place
    counts64 = torch.zeros(b, dtype=torch.int64) if counts is None else counts.to(torch.int64)
    starts = (block_positions[:, 0] - counts64).contiguous()
    lengths = counts64 + q
    offsets = torch.cumsum(lengths, 0) - lengths
    flat = torch.repeat_interleave(starts - offsets, lengths) + torch.arange(int(lengths.sum()))
    cos, sin = rotary.at(flat, x.dtype)
    slots = slots.to(torch.int64).contiguous()
    layers.run_layers(plans, x, features, counts, cache, slots, starts, cos, sin, causal=False)
    return x.view(b, q, -1)
