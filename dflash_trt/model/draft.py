"""The DFlash drafter: a Qwen3-style block-diffusion model conditioned on target features.

Per step (paper §3, z-lab `DFlashDraftModel`):
1. context: committed tokens' `target_hidden` [B, T, n*H] -> `fc` -> `hidden_norm` = context
   features; every draft layer stores K = k_norm(k_proj(ctx)) with RoPE at the token's absolute
   position and V = v_proj(ctx) in the draft cache (`append_context`, or folded into `forward`).
2. block: the noise block `[bonus, MASK x K]` (embedded with the TARGET's embed_tokens) at
   positions start..start+K attends to [context ; block] — non-causal inside the block on
   full-attention layers, causal + window on sliding layers — and slots 1..K go through the draft
   `norm` and the TARGET `lm_head`; the proposal is the argmax at each slot.
The cache holds both: context at 0..start-1, the block's transient K/V at start..start+K (the next
step's context overwrites them), so attention reads one contiguous span per row.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.checkpoint.configs import DraftConfig
from dflash_trt.model import cpu_layers, cpu_ops
from dflash_trt.model.dflash2 import CandidateSelector
from dflash_trt.model.draft_heads import (
    CONFIDENCE_FIRST,
    VocabHead,
    any_sampled,
    confident_drafts,
    confident_prefix,
    coupled_drafts,
)
from dflash_trt.model.draft_layer import DraftLayer
from dflash_trt.model.kv_cache import KVCache
from dflash_trt.model.layers import RMSNorm, Rotary, call_linear, head_logits


class DFlashDraft(nn.Module):
    def __init__(self, config: DraftConfig):
        super().__init__()
        d = config.dims
        self.config = config
        self.layers = nn.ModuleList(DraftLayer(config, i) for i in range(d.num_layers))
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.fc = nn.Linear(len(config.target_layer_ids) * d.hidden_size, d.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.rotary = Rotary(d.rope, d.head_dim)
        self.vocab: tuple[torch.Tensor, VocabHead] | None = None  # (token ids, head rows) of a draft vocabulary (use_vocab)
        if config.is_dflash2:
            self.candidate_selector = CandidateSelector(d.hidden_size, config.vocab_size, config.selector_rank,
                                                        config.selector_top_k)
        else:
            self.candidate_selector = None

    def fuse(self) -> DFlashDraft:
        """Fuse q/k/v and gate/up matmuls for inference (parameters keep their HF names)."""
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    def new_cache(self, n_slots: int, capacity: int) -> KVCache:
        d = self.config.dims
        w = self.fc.weight
        return KVCache(d.num_layers, n_slots, capacity, d.num_kv_heads, d.head_dim, w.dtype, w.device)

    def context_features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """target_hidden [B, T, n*H] -> fc -> hidden_norm: the features whose K/V form the context."""
        return self.hidden_norm(call_linear(self.fc, target_hidden.to(self.fc.weight.dtype)))

    def append_context(
        self,
        target_hidden: torch.Tensor,  # [B, T, n*H]
        positions: torch.Tensor,  # [B, T] absolute positions of those tokens
        cache: KVCache,
        slots: torch.Tensor,  # [B]
        valid: torch.Tensor | None = None,  # [B, T] bool: ragged rows (pad entries skipped)
    ) -> None:
        """Store the context K/V of committed tokens; the caller advances `cache.lengths`."""
        ctx = self.context_features(target_hidden)
        cos, sin = self.rotary(positions, ctx.dtype)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.key_value(ctx, cos, sin)
            cache.write(i, slots, positions, k, v, valid)

    def take_context(self, pending: tuple | None, cache: KVCache, slots: torch.Tensor | None) -> tuple | None:
        """A deferred context `pending` = (slots, target_hidden, positions, valid), or None: the
        `context` argument of a draft pass over exactly those `slots`; otherwise stored in `cache`
        now (append_context) and None returned."""
        if pending is None:
            return None
        if slots is not None and (pending[0] is slots or torch.equal(pending[0], slots)):
            return pending[1:]
        rows, target_hidden, positions, valid = pending
        self.append_context(target_hidden, positions, cache, rows, valid)
        return None

    def forward(
        self,
        noise_embedding: torch.Tensor,  # [B, Q, H] target embeddings of [bonus, MASK x K]
        block_positions: torch.Tensor,  # [B, Q]: start .. start+Q-1, start = the row's context length
        cache: KVCache,
        slots: torch.Tensor,  # [B]
        context: tuple | None = None,  # (target_hidden [B, T, n*H], positions [B, T], valid [B, T] | None)
    ) -> torch.Tensor:  # [B, Q, H] after the draft norm
        """Draft one block per row. The context K/V of positions < start must be in `cache`, or come
        in `context` (tokens committed since the last call): then they are stored in the same pass,
        equal to `append_context` followed by this call, with one projection per layer instead of two.
        The block's own K/V land at start..start+Q-1 (transient: the next context overwrites them).
        """
        x = self._block_input(noise_embedding)
        b = x.shape[0]
        if b == 1 and self.full_attention and cpu_layers.eligible(block_positions, cache):
            plans = cpu_layers.plans(self.layers)
            out = self._one_sequence_cpu(plans, x, context, block_positions, cache, slots) if plans else None
            if out is not None:
                return out
        positions, valid, ctx = block_positions, None, None
        if context is not None:
            hidden, ctx_positions, ctx_valid = context
            if b == 1 and ctx_valid is not None:  # one row: its committed rows are a prefix
                n = int(ctx_valid.sum())
                hidden, ctx_positions, ctx_valid = hidden[:, :n], ctx_positions[:, :n], None
            ctx = self.context_features(hidden)
            positions = torch.cat([ctx_positions, block_positions], dim=1)
            if ctx_valid is not None:
                valid = torch.cat([ctx_valid, torch.ones_like(block_positions, dtype=torch.bool)], dim=1)
        if self.full_attention and cpu_layers.eligible(block_positions, cache):
            plans = cpu_layers.plans(self.layers)
            rows = self._context_rows(ctx, positions, valid, block_positions) if plans is not None else None
            if rows is not None:
                return self.norm(self._layers_cpu(plans, x, *rows, block_positions, cache, slots))
        rope = self.rotary(positions, x.dtype)
        key_end = block_positions[:, -1] + 1  # [B]: context + block
        s = int(key_end.max())
        uniform = b == 1 or bool((key_end == s).all())
        masks = {}  # one mask per distinct (causal, window) layer kind
        for i, layer in enumerate(self.layers):
            kind = (layer.is_causal, layer.window)
            if kind not in masks:
                masks[kind] = layer.visible(block_positions, key_end, s, uniform)
            x = layer(x, ctx, rope, cache, i, slots, positions, valid, s, masks[kind])
        return self.norm(x)

    def _block_input(self, noise_embedding: torch.Tensor) -> torch.Tensor:
        """The block's embeddings in the drafter's dtype, times z-lab's input scale."""
        x = noise_embedding.to(self.fc.weight.dtype)
        return x * self.config.input_embedding_scale if self.config.input_embedding_scale != 1.0 else x

    @property
    def full_attention(self) -> bool:
        """Every layer non-causal without a window, and no DFlash2 convolution: each block row sees its whole
        context and block, and the C++ layer (which has no convolution) applies."""
        return self.candidate_selector is None and all(not layer.is_causal and layer.window is None
                                                       for layer in self.layers)

    @staticmethod
    def _context_rows(ctx, positions, valid, block_positions) -> tuple | None:
        """Context of a draft pass as the C++ layer takes it: features [sum C_b, H] and counts [B]
        (int32), or (None, None) without context; None when a row's context is not the prefix of its
        positions right before its block (the torch path handles any layout)."""
        if ctx is None:
            return None, None
        b, c, _ = ctx.shape
        if valid is None:
            counts = torch.full((b,), c, dtype=torch.int64)
        else:
            valid = valid[:, :c]
            counts = valid.sum(dim=1)
            if not torch.equal(valid, torch.arange(c)[None, :] < counts[:, None]):
                return None
        ctx_positions = positions[:, :c]
        if c:
            steps = ctx_positions[:, 1:] - ctx_positions[:, :-1] == 1  # consecutive, where valid
            if valid is not None:
                steps |= ~valid[:, 1:]
            if not (torch.equal(ctx_positions[:, 0] + counts, block_positions[:, 0]) and bool(steps.all())):
                return None
        features = ctx.reshape(b * c, -1) if valid is None else ctx[valid]
        return features.contiguous(), counts.to(torch.int32)

    def _one_sequence_cpu(self, plans, x, context, block_positions, cache: KVCache, slots) -> torch.Tensor | None:
        """The C++ pass for one sequence with Python ints in place of the batched path's tensor
        bookkeeping (~250 µs less per draft step here): the same K/V writes and outputs. None when the
        context is not the consecutive run of positions right before the block (the general path)."""
        args = self._one_sequence_args(x, context, block_positions, cache, slots)
        if args is None:
            return None
        cpu_layers.run_layers(plans, *args, causal=False)
        return self.norm(args[0].view(1, x.shape[1], -1))

    def _context_features_cpu(self, target_hidden: torch.Tensor) -> torch.Tensor:
        """`context_features` of one sequence's rows [T, n*H] on the C++ path: fc through its cached
        panels (the cold 0.4 MB weight streamed with prefetch: ~110 -> ~40 µs a decode step), then the
        norm; the torch path where that does not apply."""
        x = target_hidden.to(self.fc.weight.dtype).contiguous()
        projected = cpu_ops.head_matmul(x, self.fc)
        norm = self.hidden_norm
        out = None if projected is None else cpu_ops.rms_norm(projected, norm.weight, norm.eps)
        return out if out is not None else self.context_features(target_hidden).contiguous()

    @staticmethod
    def _one_sequence_context(context, start: int) -> tuple[int, torch.Tensor | None] | None:
        """(n, target_hidden [n, n_taps*H] or None) of one sequence's new context, which must be the run
        of positions right before its block at `start`; None otherwise. (Positions are read once as a
        Python list: each tensor element read is ~5 µs in a decode loop.)"""
        if context is None:
            return 0, None
        hidden, ctx_positions, ctx_valid = context
        n = hidden.shape[1] if ctx_valid is None else int(ctx_valid.sum())  # one row: a prefix is valid
        if not n:
            return 0, None
        ctx = ctx_positions[0, :n].tolist()
        if ctx[0] + n != start or ctx[-1] != start - 1:
            return None
        return n, hidden[0, :n]

    def _one_sequence_args(self, x, context, block_positions, cache: KVCache, slots) -> tuple | None:
        """`run_layers` arguments (x ... sin, x a copy) for one sequence whose context is the run of
        positions right before its block; None otherwise."""
        start, width = int(block_positions[0, 0]), x.shape[1]
        if (new := self._one_sequence_context(context, start)) is None:
            return None
        n, target_hidden = new
        features = None if target_hidden is None else self._context_features_cpu(target_hidden)
        counts = None if target_hidden is None else torch.tensor([n], dtype=torch.int32)
        x = x.reshape(width, -1).clone()  # updated in place
        cos, sin = self.rotary.rows(start - n, n + width, x.dtype)
        return x, features, counts, cache, slots.to(torch.int64).contiguous(), torch.tensor([start - n]), cos, sin

    def _layers_cpu(self, plans, x, features, counts, block_positions, cache: KVCache, slots) -> torch.Tensor:
        """All layers through the C++ layer (model/cpu_layers.py) -> [B, Q, H]. features [sum C_b, H]
        and counts [B] are each row's context (None: none), right before its block."""
        b, q, _ = x.shape
        x = x.reshape(b * q, -1).clone()  # [B*Q, H], updated in place
        counts64 = torch.zeros(b, dtype=torch.int64) if counts is None else counts.to(torch.int64)
        starts = (block_positions[:, 0] - counts64).contiguous()
        lengths = counts64 + q  # one sequence never gets here: `_one_sequence_cpu` takes it
        offsets = torch.cumsum(lengths, 0) - lengths
        flat = torch.repeat_interleave(starts - offsets, lengths) + torch.arange(int(lengths.sum()))
        cos, sin = self.rotary.at(flat, x.dtype)
        slots = slots.to(torch.int64).contiguous()
        cpu_layers.run_layers(plans, x, features, counts, cache, slots, starts, cos, sin, causal=False)
        return x.view(b, q, -1)

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Draft logits through the TARGET lm_head, with z-lab's multiplier and softcap."""
        # a sliced [B, K, H] view would make F.linear fall back to a batched matmul (~5x slower on CPU)
        flat = hidden.to(lm_head.weight.dtype).reshape(-1, hidden.shape[-1])
        # on CPU the head's panels (`head_logits`), so the one-call draft step's coupled drafts see the same bits
        logits = head_logits(lm_head, flat).view(*hidden.shape[:-1], -1)
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def use_vocab(self, token_ids: list[int] | None, lm_head: nn.Module) -> DFlashDraft:
        """Propose only from `token_ids` (a draft vocabulary, model/draft_vocab.py), scoring them with
        their rows of `lm_head`; None: the full vocabulary. Proposals only: lossless either way."""
        if token_ids is None:
            self.vocab = None
            return self
        weight = lm_head.weight.detach()
        # in ascending id: the sampling rule's order (each column's noise and tie order are its token's)
        ids = torch.tensor(sorted(token_ids), dtype=torch.int64, device=weight.device)
        self.vocab = (ids, VocabHead(weight[ids].contiguous()))
        return self

    @property
    def vocab_size(self) -> int | None:
        """Tokens the head scores when proposing (None: the target's full vocabulary)."""
        return None if self.vocab is None else int(self.vocab[0].numel())

    def propose(self, hidden: torch.Tensor, lm_head: nn.Module, min_confidence: float = 0.0,
                start: torch.Tensor | None = None, sampling=None, anchor: torch.Tensor | None = None) -> torch.Tensor:
        """Drafts [B, K' <= K] for block slots 1..K (`hidden` [B, K, H]): greedy (`confident_drafts`), or,
        when some row samples (`sampling` = (T, top_k, top_p, seed) [B], `start` [B] the bonus positions),
        coupled drafts for all K slots (`coupled_drafts`: the sampling rule on the draft logits with the
        request's own noise; greedy rows still argmax). With a draft vocabulary (`use_vocab`) only its
        tokens are scored."""
        vocab = self.vocab
        head = lm_head if vocab is None else vocab[1]
        if self.candidate_selector is not None:  # DFlash2: the selector's walk from the bonus token (all K slots)
            if anchor is None:
                raise ValueError("a DFlash2 drafter proposes from the block's first token: pass anchor")
            return self.candidate_selector.drafts(hidden, self.logits(hidden, head), anchor, start,
                                                  sampling if any_sampled(sampling) else None,
                                                  None if vocab is None else vocab[0])
        if any_sampled(sampling):
            columns = self._coupled(hidden, head, start, sampling, min_confidence)
            return columns if vocab is None else vocab[0][columns]
        plain = self.config.output_multiplier == 1.0 and not self.config.final_logit_softcapping
        if plain and cpu_ops.head_ready(hidden, head):  # one sequence on CPU: the same in C++
            drafts = cpu_ops.greedy_drafts(hidden[0], head, min_confidence, CONFIDENCE_FIRST)[None]
        else:
            drafts = confident_drafts(lambda lo, hi: self.logits(hidden[:, lo:hi], head), hidden.shape[1],
                                      min_confidence, CONFIDENCE_FIRST)
        return drafts if vocab is None else vocab[0][drafts]

    def _coupled(self, hidden, head, start, sampling, min_confidence: float) -> torch.Tensor:
        """Coupled drafts [B, K' <= K] (head columns) in chunks of slots (CONFIDENCE_FIRST, then the rest):
        with the confidence cut, the later slots' head and sampling are skipped once no row trusts them."""
        vocab_ids = None if self.vocab is None else self.vocab[0]
        k, lo, chunks, running = hidden.shape[1], 0, [], None
        while lo < k:
            hi = k if (lo or min_confidence <= 0.0) else min(k, CONFIDENCE_FIRST)
            logits = self.logits(hidden[:, lo:hi], head)
            columns = coupled_drafts(logits, start + lo, sampling, vocab_ids)
            if min_confidence <= 0.0:
                return columns
            kept, running = confident_prefix(logits, columns, sampling[0], min_confidence, running)
            chunks.append(columns[:, :kept])
            if kept < hi - lo:
                break
            lo = hi
        return torch.cat(chunks, dim=1)

    def draft_block(self, noise_embedding: torch.Tensor, block_positions: torch.Tensor, cache: KVCache,
                    slots: torch.Tensor, context: tuple | None, lm_head: nn.Module,
                    min_confidence: float = 0.0, sampling=None, anchor: torch.Tensor | None = None) -> torch.Tensor:
        """Drafts [B, K' <= K] of block slots 1..K: `forward` then `propose`, with the same K/V writes
        and the same drafts. One sequence on the C++ path is one call (`cpu_layers.DraftStep`); with a
        confidence cut its last layer outputs the rows the cut reads: slots 1..CONFIDENCE_FIRST, and
        the rest only when all of those are trusted (a row's output depends on no other row's query,
        so nothing changes). Sampled rows (`sampling`) get coupled drafts (`propose`), one sampled
        sequence in the same one call (its rule the C++ twin's, the same picks). `anchor` [B]: the
        block's first tokens (a DFlash2 drafter's selector starts from them)."""
        if not any_sampled(sampling) or self.candidate_selector is None:
            drafts = self._one_call_drafts(noise_embedding, block_positions, cache, slots, context, lm_head,
                                           min_confidence, sampling)
            if drafts is not None:
                return drafts
        hidden = self(noise_embedding, block_positions, cache, slots, context)
        return self.propose(hidden[:, 1:], lm_head, min_confidence, block_positions[:, 0], sampling, anchor)

    def _one_call_drafts(self, noise_embedding, block_positions, cache: KVCache, slots, context, lm_head,
                         min_confidence: float, sampling=None) -> torch.Tensor | None:
        """`draft_block` for one sequence through `cpu_layers.DraftStep`, or None where it does not
        apply: its context must be the run of positions right before its block, and a sampled row's
        rule the C++ twin (`cpu_ops.twin_rule`; coupled drafts, as `propose` picks them)."""
        b, q = block_positions.shape
        if not (b == 1 and self.full_attention and self.config.output_multiplier == 1.0
                and not self.config.final_logit_softcapping and cpu_layers.eligible(block_positions, cache)):
            return None
        sampled = any_sampled(sampling)
        rule = cpu_ops.twin_rule(sampling, noise_embedding) if sampled else None
        if sampled and rule is None:
            return None
        plans = cpu_layers.plans(self.layers)
        vocab = self.vocab
        head, ids = (lm_head, None) if vocab is None else (vocab[1], vocab[0])
        step = None if plans is None else cpu_layers.DraftStep.of(self, plans, self.fc, self.hidden_norm, self.norm,
                                                                   head, ids, CONFIDENCE_FIRST)
        if step is None:
            return None
        start = int(block_positions[0, 0])
        if (new := self._one_sequence_context(context, start)) is None:
            return None
        n, target_hidden = new
        if target_hidden is not None:
            target_hidden = target_hidden.to(self.fc.weight.dtype).contiguous()
        x = self._block_input(noise_embedding).reshape(q, -1).contiguous()
        cos, sin = self.rotary.rows(start - n, n + q, x.dtype)
        return step(x, target_hidden, cos, sin, cache, int(slots[0]), start, min_confidence, rule)[None]
