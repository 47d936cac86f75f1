"""The DFlash drafter: a Qwen3-style block-diffusion model conditioned on target features.

Per step (paper §3, z-lab `DFlashDraftModel`):
1. context: committed tokens' `target_hidden` [B, T, n*H] -> `fc` -> `hidden_norm` = context
   features; every draft layer stores K = k_norm(k_proj(ctx)) with RoPE at the token's absolute
   position and V = v_proj(ctx) in the draft cache (`append_context`, or folded into `forward`).
2. block: the noise block `[bonus, MASK x K]` (embedded with the TARGET's embed_tokens) at
   positions start..start+K attends to [context ; block] — non-causal inside the block on
   full-attention layers, causal + window on sliding layers — and slots 1..K go through the draft
   `norm` and the TARGET `lm_head` (`logits`); proposals from those logits are the algorithm's
   (decoding/drafts.py).
The cache holds both: context at 0..start-1, the block's transient K/V at start..start+K (the next
step's context overwrites them), so attention reads one contiguous span per row.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from dflash_trt.checkpoint.configs import DraftConfig
from dflash_trt.decoding.batch import Rows
from dflash_trt.model.dflash2 import CandidateSelector
from dflash_trt.model.draft_layer import DraftLayer
from dflash_trt.model.kv_cache import KVCache
from dflash_trt.model.layers import RMSNorm, Rotary


class VocabHead:
    """A draft-vocabulary head: the target lm_head's rows of the draft vocabulary (not a parameter)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)


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
        self.vocab: tuple[torch.Tensor, VocabHead] | None = None  # (token ids, their head rows): use_vocab
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
        return self.hidden_norm(self.fc(target_hidden.to(self.fc.weight.dtype)))

    def append_context(
        self,
        target_hidden: torch.Tensor,  # [B, T, n*H]
        positions: torch.Tensor,  # [B, T] absolute positions of those tokens
        cache: KVCache,
        slots: torch.Tensor,  # [B]
        valid: torch.Tensor | None = None,  # [B, T] bool: ragged rows (pad entries skipped)
        on_device: bool = False,  # read nothing back: the positions are committed ones, inside the cache
    ) -> None:
        """Store the context K/V of committed tokens; the caller advances `cache.lengths`."""
        ctx = self.context_features(target_hidden)
        end = cache.capacity if on_device else None
        cos, sin = self.rotary(positions, ctx.dtype, end)
        for i, layer in enumerate(self.layers):
            k, v = layer.self_attn.key_value(ctx, cos, sin)
            cache.write(i, slots, positions, k, v, valid, end)

    def forward(
        self,
        noise_embedding: torch.Tensor,  # [B, Q, H] target embeddings of [bonus, MASK x K]
        block_positions: torch.Tensor,  # [B, Q]: start .. start+Q-1, start = the row's context length
        cache: KVCache,
        slots: torch.Tensor,  # [B]
        context: tuple | None = None,  # (target_hidden [B, T, n*H], positions [B, T], valid [B, T] | None)
        rows: Rows | None = None,  # the block's rows as the host knows them: no device value is read back
    ) -> torch.Tensor:  # [B, Q, H] after the draft norm
        """Draft one block per row. The context K/V of positions < start must be in `cache`, or come
        in `context` (tokens committed since the last call): then they are stored in the same pass,
        equal to `append_context` followed by this call, with one projection per layer instead of two.
        The block's own K/V land at start..start+Q-1 (transient: the next context overwrites them).
        """
        x = self.block_input(noise_embedding)
        b = x.shape[0]
        positions, valid, ctx = block_positions, None, None
        if context is not None:
            hidden, ctx_positions, ctx_valid = context
            if b == 1 and ctx_valid is not None and rows is None:  # one row: its committed rows are a prefix
                n = int(ctx_valid.sum())
                hidden, ctx_positions, ctx_valid = hidden[:, :n], ctx_positions[:, :n], None
            ctx = self.context_features(hidden)
            positions = torch.cat([ctx_positions, block_positions], dim=1)
            if ctx_valid is not None:
                valid = torch.cat([ctx_valid, torch.ones_like(block_positions, dtype=torch.bool)], dim=1)
        key_end = block_positions[:, -1] + 1  # [B]: context + block
        if rows is not None:
            # the rope table spans the cache: a skipped context entry may sit past the block (a rejected draft of
            # a wider block), and the table never grows (and moves) under a captured CUDA graph
            rope = self.rotary(positions, x.dtype, cache.capacity)
            s, uniform = rows.read_end, rows.uniform
        else:
            rope = self.rotary(positions, x.dtype)
            s = int(key_end.max())
            uniform = b == 1 or bool((key_end == s).all())
        masks = {}  # one mask per distinct (causal, window) layer kind
        for i, layer in enumerate(self.layers):
            kind = (layer.is_causal, layer.window)
            if kind not in masks:
                masks[kind] = layer.visible(block_positions, key_end, s, uniform)
            x = layer(x, ctx, rope, cache, i, slots, positions, valid, s, masks[kind], rows)
        return self.norm(x)

    def block_input(self, noise_embedding: torch.Tensor) -> torch.Tensor:
        """The block's embeddings in the drafter's dtype, times z-lab's input scale."""
        x = noise_embedding.to(self.fc.weight.dtype)
        return x * self.config.input_embedding_scale if self.config.input_embedding_scale != 1.0 else x

    def scale_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """z-lab's output multiplier and softcap on raw head logits."""
        if self.config.output_multiplier != 1.0:
            logits = logits * self.config.output_multiplier
        cap = self.config.final_logit_softcapping
        return torch.tanh(logits / cap) * cap if cap else logits

    def logits(self, hidden: torch.Tensor, lm_head: nn.Module) -> torch.Tensor:
        """Draft logits [..., V] through the TARGET lm_head (or a draft vocabulary's rows)."""
        return self.scale_logits(lm_head(hidden.to(lm_head.weight.dtype)))

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
