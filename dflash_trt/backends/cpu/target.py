"""The target's passes on CPU: `Target.forward` through the C++ layer, logits through the head's panels, and
the lazy verify (`verify_lazily`).

A pass of up to `layers.MAX_ROWS` rows, each sequence's rows at consecutive positions, is one C++ call
per decoder layer; a larger one (a long prompt, a big batch of prompts) runs as pieces that each fit,
in position order, so every piece attends to what the ones before it cached. The C++ layer computes
each row with the same instruction sequence whatever shares its pass, and the head's panels give each
logit one FMA chain in a fixed order, so prefill, decode and verify rows agree bit for bit: a verify
row is a decode row. What the C++ layer does not implement (hooks, quantization simulation, non-fp32
weights) takes the module's own torch forward.
"""

from __future__ import annotations

import ctypes

import torch

from dflash_trt.backends.cpu import layers, ops


class TapBuffer:
    """A C++ pass's taps, copied after their layers into one buffer [n_taps, B*T, H] (`addresses`: where
    run_layers copies x to) instead of cloned one by one and joined after the pass (a memmove costs a
    fraction of a torch op). `items()` gives the layers before the last as [B, T, H]; `joined`
    target_hidden [B, T, n_taps*H], the last layer's tap being `final` (the normed output)."""

    def __init__(self, x: torch.Tensor, b: int, t: int, tap_layers: tuple[int, ...], last: int):
        self.shape, self.order, self.last = (b, t, x.shape[-1]), {i: k for k, i in enumerate(tap_layers)}, last
        self.buffer = torch.empty(len(tap_layers), *x.shape, dtype=x.dtype)
        self.size = x.numel() * x.element_size()
        self.addresses = {i: self.buffer.data_ptr() + k * self.size for i, k in self.order.items() if i != last}

    def items(self):
        return ((i, self.buffer[k].view(self.shape)) for i, k in self.order.items() if i != self.last)

    def joined(self, final: torch.Tensor | None) -> torch.Tensor:
        if final is not None:
            final = final.contiguous()
            assert final.numel() * final.element_size() == self.size and final.dtype == self.buffer.dtype
            ctypes.memmove(self.buffer.data_ptr() + self.order[self.last] * self.size, final.data_ptr(), self.size)
        b, t, h = self.shape
        if b * t == 1:  # [n, 1, H] is [1, 1, n*H] in memory
            return self.buffer.view(b, t, -1)
        return self.buffer.permute(1, 0, 2).reshape(b, t, len(self.order) * h)


def norm(module, x: torch.Tensor) -> torch.Tensor:
    """An RMSNorm module applied by the C++ norm where it runs (one call instead of torch's few ops)."""
    out = ops.rms_norm(x.contiguous(), module.weight, module.eps) if x.numel() else None
    return out if out is not None else module(x)


def head_logits(head, x: torch.Tensor) -> torch.Tensor:
    """A head's logits x [..., H] -> [..., V], each row the same bits whatever the pass (the head's panels:
    one FMA chain per logit in a fixed order); the head's own call where the panels do not apply."""
    if x.dtype == torch.float32 and x.numel() and ops.eager():
        out = ops.head_matmul(x.reshape(-1, x.shape[-1]).contiguous(), head)
        if out is not None:
            return out.view(*x.shape[:-1], out.shape[-1])
    return head(x)


def forward(target, tokens: torch.Tensor, positions: torch.Tensor, cache, slots: torch.Tensor,
            tap_layers: tuple[int, ...] = (), logit_rows: torch.Tensor | None = None, head: bool = True):
    """`Target.forward` with the C++ layer: -> logits [B, R, V] (or final-norm hidden [B, R, H] when not
    `head`), target_hidden [B, T, n_taps * H] (None without taps)."""
    plans = layers.plans(target.model.layers) if layers.eligible(positions, cache) else None
    if plans is not None:
        x, taps = _layers_cpu(target, plans, tokens, positions, cache, slots, tap_layers)
    elif (pieces := _pieces(target, positions, cache)) is not None:
        x, taps = _layers_in_pieces(target, pieces, tokens, positions, cache, slots, tap_layers)
    else:  # the module's own torch path
        hidden, target_hidden = target(tokens, positions, cache, slots, tap_layers, logit_rows, head=False)
        return (head_logits(target.lm_head, hidden) if head else hidden), target_hidden
    last = len(target.model.layers) - 1
    x = norm(target.model.norm, x)
    if isinstance(taps, TapBuffer):
        target_hidden = taps.joined(x if last in tap_layers else None)
    else:
        if last in tap_layers:
            taps[last] = x
        target_hidden = torch.cat([taps[i] for i in tap_layers], dim=-1) if tap_layers else None
    if logit_rows is not None:
        x = x.gather(1, logit_rows[..., None].expand(-1, -1, x.shape[-1]))
    return (head_logits(target.lm_head, x) if head else x), target_hidden


def _pieces(target, positions: torch.Tensor, cache) -> list[tuple[torch.Tensor, int, int]] | None:
    """A pass too large for one C++ call as pieces that each fit: (rows, t0, t1) — groups of whole rows, or
    one row's positions in windows, in position order. None when the C++ layer does not apply at all."""
    b, t = positions.shape
    limit = layers.MAX_ROWS
    if b * t <= limit or layers.plans(target.model.layers) is None:
        return None
    if t <= limit:
        per = limit // t
        pieces = [(torch.arange(i, min(b, i + per)), 0, t) for i in range(0, b, per)]
    else:
        pieces = [(torch.tensor([i]), t0, min(t, t0 + limit)) for i in range(b) for t0 in range(0, t, limit)]
    if not all(layers.eligible(positions[rows, t0:t1], cache) for rows, t0, t1 in pieces):
        return None
    return pieces


def _layers_in_pieces(target, pieces, tokens, positions, cache, slots, tap_layers):
    """`_layers_cpu` piece by piece, assembled into x [B, T, H] and taps {layer: [B, T, H]}."""
    plans = layers.plans(target.model.layers)
    x, taps = None, {}
    for rows, t0, t1 in pieces:
        part, part_taps = _layers_cpu(target, plans, tokens[rows, t0:t1], positions[rows, t0:t1], cache,
                                      slots[rows], tap_layers)
        if x is None:
            x = part.new_empty(tokens.shape[0], tokens.shape[1], part.shape[-1])
        x[rows, t0:t1] = part
        for i, value in part_taps.items():
            taps.setdefault(i, value.new_empty(x.shape))[rows, t0:t1] = value
    return x, taps


def _layers_cpu(target, plans, tokens, positions, cache, slots, tap_layers):
    """All decoder layers through the C++ layer -> x [B, T, H] before the final norm, and the taps
    (a TapBuffer; {} without taps)."""
    b, t = tokens.shape
    x = target.embed(tokens).reshape(b * t, -1).contiguous()  # [B*T, H], updated in place by the layers
    starts = positions[:, 0].contiguous()
    if b == 1:
        cos, sin = target.rotary.rows(int(starts[0]), t, x.dtype)
    else:
        cos, sin = target.rotary.at(positions.reshape(-1), x.dtype)
    slots = slots.to(torch.int64).contiguous()
    taps = TapBuffer(x, b, t, tap_layers, len(plans) - 1) if tap_layers else {}
    layers.run_layers(plans, x, None, None, cache, slots, starts, cos, sin, causal=True,
                      copies=taps.addresses if tap_layers else None)
    return x.view(b, t, -1), taps


# --- lazy verification: the head only as far as some row's drafts still match -----------------------
#
# A verify block's rows go through the head and the sampling rule in growing chunks (4, 4, 8, ...); once
# every row has a mismatch, later rows are not computed. Each row's token is the rule applied to that row's
# logits alone, so the tokens that matter — t_0 .. t_a of every row — are the ones
# `decoding.verify.verify_block` returns; entries after t_a are unspecified (-1 where never computed). One
# sequence runs the same in C++: greedy (`ops.greedy_verify`; the rule is argmax), sampled where the rule's
# body is the C++ twin (`ops.sampled_verify`, the twin's rule by pointer).

SAMPLED_FIRST = 2  # rows of a sampled row's first head chunk in the C++ verify (greedy: `first`)


def verify_lazily(
    hidden: torch.Tensor,  # [B, K+1, H] final-norm hidden states over [bonus, d_1 .. d_K]
    lm_head,  # [N, H] -> [N, V]
    drafts: torch.Tensor,  # [B, K]
    start: torch.Tensor,  # [B]
    sampling,  # temperature, top_k, top_p, seed [B]
    verify,  # the kernels' verify_block
    twin: bool,  # `verify`'s sampling rule is the C++ twin (the C++ heads may call it)
    first: int = 4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`verify_block`'s tokens [B, K+1] (t_0 .. t_a specified) and accepted [B], the head run lazily."""
    b, width, h = hidden.shape
    if ops.head_ready(hidden, lm_head):  # one sequence: the whole verify in C++
        if float(sampling[0][0]) == 0.0:
            row_tokens, a = ops.greedy_verify(hidden[0], lm_head, drafts[0], first)
            return row_tokens[None], torch.tensor([a])
        if twin:  # sampled rows are rarely accepted far: 2 rows at a time
            row_tokens, a = ops.sampled_verify(hidden[0], lm_head, drafts[0], SAMPLED_FIRST, ops.twin_rule(sampling),
                                               int(start[0]))
            return row_tokens[None], torch.tensor([a])
    tokens = torch.full((b, width), -1, dtype=torch.int64, device=hidden.device)
    matched = torch.ones(b, dtype=torch.bool, device=hidden.device)  # every draft so far accepted
    accepted = torch.zeros(b, dtype=torch.int64, device=hidden.device)
    lo, size = 0, first
    while lo < width:
        hi = min(width, lo + size)
        logits = head_logits(lm_head, hidden[:, lo:hi].reshape(-1, h)).view(b, hi - lo, -1)
        # the rule on rows lo..hi-1 (positions start+lo+1 ..); the drafts argument only sizes the call
        chunk, _ = verify(logits, drafts.new_zeros(b, hi - lo - 1), start + lo, *sampling)
        tokens[:, lo:hi] = chunk
        n = min(hi, drafts.shape[1]) - lo  # drafts d_{lo+1} .. d_{min(hi, K)} are judged by this chunk
        run = (drafts[:, lo : lo + n] == chunk[:, :n]).to(torch.int64).cumprod(dim=1)  # [B, n]
        accepted += run.sum(dim=1) * matched
        matched &= run[:, -1].bool() if n else matched
        if not bool(matched.any()):
            break
        lo, size = hi, 2 * size if lo else size
    return tokens, accepted
