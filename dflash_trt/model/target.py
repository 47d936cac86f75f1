"""The target model (Qwen3 / Llama 3.x decoder) with hidden-state taps for DFlash.

Parameter names are Hugging Face's (`model.layers.{i}.self_attn.q_proj.weight`, ...), so a HF
state dict loads unchanged. `forward` runs ragged rows of a batch at their own absolute positions
against a static per-slot `KVCache` and returns logits for the requested rows plus `target_hidden`:
the post-layer residual stream of every layer in `target_layer_ids`, concatenated in list order.

FOOTGUN (HF convention, kept on purpose): HF's `hidden_states[L]` for the LAST layer is taken
AFTER the final norm, so a tap on layer L-1 is `norm(output of layer L-1)`. DFlash drafters are
trained on HF taps, so we return exactly what HF returns.
"""

from __future__ import annotations

import torch
from torch import nn

from dflash_trt.checkpoint.configs import TargetConfig
from dflash_trt.decoding.batch import Rows
from dflash_trt.model.kv_cache import KVCache
from dflash_trt.model.layers import MLP, AttentionProjections, RMSNorm, Rotary

CHUNK_ROWS = 1024  # rows of a long pass run at once: bounds a prompt's masks and scores to [1024, keys]


class DecoderLayer(nn.Module):
    def __init__(self, config: TargetConfig):
        super().__init__()
        d = config.dims
        self.input_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.self_attn = AttentionProjections(d)
        self.post_attention_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.mlp = MLP(d)

    def forward(self, x, rope, cache: KVCache, layer: int, slots, positions, visible, rows: Rows | None = None):
        h = self.input_layernorm(x)
        q, k, v = self.self_attn.query_key_value(h, *rope)
        cache.write(layer, slots, positions, k, v, end=rows and rows.end)
        keys, values = cache.read(layer, slots, visible.shape[-1], rows)
        x = x + self.self_attn.attend(q, keys, values, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, config: TargetConfig):
        super().__init__()
        d = config.dims
        self.embed_tokens = nn.Embedding(config.vocab_size, d.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(d.num_layers))
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)


class Target(nn.Module):
    def __init__(self, config: TargetConfig):
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.dims.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.rotary = Rotary(config.dims.rope, config.dims.head_dim)

    def new_cache(self, n_slots: int, capacity: int) -> KVCache:
        d = self.config.dims
        w = self.lm_head.weight
        return KVCache(d.num_layers, n_slots, capacity, d.num_kv_heads, d.head_dim, w.dtype, w.device)

    def fuse(self) -> Target:
        """Fuse q/k/v and gate/up matmuls for inference (parameters keep their HF names)."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()
        return self

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(tokens)

    def forward(
        self,
        tokens: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T] absolute positions
        cache: KVCache,
        slots: torch.Tensor,  # [B] cache slot of each row
        tap_layers: tuple[int, ...] = (),
        logit_rows: torch.Tensor | None = None,  # [B, R] indices into T; None = all T rows
        head: bool = True,  # False: return the final-norm hidden states [B, R, H] instead of logits
        rows: Rows | None = None,  # the rows as the host knows them: no device value is read back
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> logits [B, R, V] (or hidden [B, R, H]), target_hidden [B, T, len(tap_layers) * H] (None without taps).

        A long pass (a prompt of more than CHUNK_ROWS rows) runs in chunks of rows, in position order, each
        attending to the cache the chunks before it wrote: its masks and scores are [chunk, keys] instead of
        [T, keys], whatever the prompt's length (rows at the same positions give the same numbers)."""
        if tokens.shape[1] > CHUNK_ROWS and rows is None:
            parts = [self._layers(tokens[:, a : a + CHUNK_ROWS], positions[:, a : a + CHUNK_ROWS], cache, slots,
                                  tap_layers, None) for a in range(0, tokens.shape[1], CHUNK_ROWS)]
            x = torch.cat([part[0] for part in parts], dim=1)
            target_hidden = torch.cat([part[1] for part in parts], dim=1) if tap_layers else None
        else:
            x, target_hidden = self._layers(tokens, positions, cache, slots, tap_layers, rows)
        if logit_rows is not None:
            x = x.gather(1, logit_rows[..., None].expand(-1, -1, x.shape[-1]))
        return (self.lm_head(x) if head else x), target_hidden

    def _layers(self, tokens, positions, cache: KVCache, slots, tap_layers, rows: Rows | None):
        """Every layer over these rows (K/V into the cache) -> final-norm hidden [B, T, H], taps (or None)."""
        x = self.embed(tokens)
        # with rows, the rope table spans the cache: it never grows (and moves) under a captured CUDA graph
        end = rows.read_end if rows is not None else int(positions.max()) + 1
        rope = self.rotary(positions, x.dtype, cache.capacity if rows is not None else end)
        key_positions = torch.arange(end, device=tokens.device)
        visible = (key_positions[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, S]
        taps = {}
        for i, layer in enumerate(self.model.layers):
            x = layer(x, rope, cache, i, slots, positions, visible, rows)
            if i in tap_layers:
                taps[i] = x
        x = self.model.norm(x)
        if len(self.model.layers) - 1 in tap_layers:  # HF's last hidden state is after the final norm
            taps[len(self.model.layers) - 1] = x
        return x, (torch.cat([taps[i] for i in tap_layers], dim=-1) if tap_layers else None)
