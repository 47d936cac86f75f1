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

import ctypes

import torch
from torch import nn

from dflash_trt.checkpoint.configs import TargetConfig
from dflash_trt.model import cpu_layers
from dflash_trt.model.kv_cache import KVCache
from dflash_trt.model.layers import (
    MLP,
    AttentionProjections,
    RMSNorm,
    Rotary,
    head_logits,
)


class DecoderLayer(nn.Module):
    def __init__(self, config: TargetConfig):
        super().__init__()
        d = config.dims
        self.input_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.self_attn = AttentionProjections(d)
        self.post_attention_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.mlp = MLP(d)

    def forward(self, x, rope, cache: KVCache, layer: int, slots, positions, visible):
        h = self.input_layernorm(x)
        q, k, v = self.self_attn.query_key_value(h, *rope)
        cache.write(layer, slots, positions, k, v)
        keys, values = cache.read(layer, slots, visible.shape[-1])
        x = x + self.self_attn.attend(q, keys, values, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    def __init__(self, config: TargetConfig):
        super().__init__()
        d = config.dims
        self.embed_tokens = nn.Embedding(config.vocab_size, d.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(d.num_layers))
        self.norm = RMSNorm(d.hidden_size, d.rms_norm_eps)


class TapBuffer:
    """A C++ pass's taps, copied after their layers into one buffer [n_taps, B*T, H] (`addresses`: where
    run_layers copies x to) instead of cloned one by one and joined after the pass: each torch op costs
    ~5 µs here, a memmove ~1 (a 1-row step's taps ~80 -> ~25 µs of its ~3.3 ms). `items()` gives the layers
    before the last as [B, T, H] (the pieces path assembles those like a dict's); `joined` target_hidden
    [B, T, n_taps*H], the last layer's tap being `final` (the normed output)."""

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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """-> logits [B, R, V] (or hidden [B, R, H]), target_hidden [B, T, len(tap_layers) * H] (None without taps)."""
        plans = cpu_layers.plans(self.model.layers) if cpu_layers.eligible(positions, cache) else None
        if plans is not None:
            x, taps = self._layers_cpu(plans, tokens, positions, cache, slots, tap_layers)
        elif (pieces := self._cpu_pieces(positions, cache)) is not None:
            x, taps = self._layers_in_pieces(pieces, tokens, positions, cache, slots, tap_layers)
        else:
            x, taps = self._layers(tokens, positions, cache, slots, tap_layers)
        last = len(self.model.layers) - 1
        x = self.model.norm(x)
        if isinstance(taps, TapBuffer):  # the C++ path copied each tap into one buffer
            target_hidden = taps.joined(x if last in tap_layers else None)
        else:
            if last in tap_layers:
                taps[last] = x
            target_hidden = torch.cat([taps[i] for i in tap_layers], dim=-1) if tap_layers else None
        if logit_rows is not None:
            x = x.gather(1, logit_rows[..., None].expand(-1, -1, x.shape[-1]))
        return (head_logits(self.lm_head, x) if head else x), target_hidden  # same bits at any row count

    def _cpu_pieces(self, positions, cache: KVCache) -> list[tuple[torch.Tensor, int, int]] | None:
        """A pass too large for one C++ call (more than cpu_layers.MAX_ROWS rows) as pieces that each fit:
        (rows, t0, t1) — groups of whole rows, or one row's positions in windows, in position order, so
        each piece attends to what the ones before it cached. The C++ layer computes every row the same
        way whatever else shares its pass (a prefill row = a decode row, bit for bit), so the pieces give
        the bits one pass would, and a long prompt's K/V are those its own decode steps would write.
        None when the C++ layer does not apply to this pass at all."""
        b, t = positions.shape
        limit = cpu_layers.MAX_ROWS
        if b * t <= limit or cpu_layers.plans(self.model.layers) is None:
            return None
        if t <= limit:
            per = limit // t
            pieces = [(torch.arange(i, min(b, i + per)), 0, t) for i in range(0, b, per)]
        else:
            pieces = [(torch.tensor([i]), t0, min(t, t0 + limit)) for i in range(b) for t0 in range(0, t, limit)]
        if not all(cpu_layers.eligible(positions[rows, t0:t1], cache) for rows, t0, t1 in pieces):
            return None
        return pieces

    def _layers_in_pieces(self, pieces, tokens, positions, cache: KVCache, slots, tap_layers):
        """`_layers_cpu` piece by piece (`_cpu_pieces`), assembled into x [B, T, H] and taps."""
        plans = cpu_layers.plans(self.model.layers)
        x, taps = None, {}
        for rows, t0, t1 in pieces:
            part, part_taps = self._layers_cpu(plans, tokens[rows, t0:t1], positions[rows, t0:t1], cache,
                                               slots[rows], tap_layers)
            if x is None:
                x = part.new_empty(tokens.shape[0], tokens.shape[1], part.shape[-1])
            x[rows, t0:t1] = part
            for i, value in part_taps.items():
                taps.setdefault(i, value.new_empty(x.shape))[rows, t0:t1] = value
        return x, taps

    def _layers(self, tokens, positions, cache: KVCache, slots, tap_layers) -> tuple[torch.Tensor, dict]:
        """The torch path: all layers over ragged rows -> x [B, T, H] before the final norm, taps."""
        x = self.embed(tokens)
        rope = self.rotary(positions, x.dtype)
        key_positions = torch.arange(int(positions.max()) + 1, device=tokens.device)
        visible = (key_positions[None, None, :] <= positions[:, :, None])[:, None]  # [B, 1, T, S]
        taps = {}
        last = len(self.model.layers) - 1
        for i, layer in enumerate(self.model.layers):
            x = layer(x, rope, cache, i, slots, positions, visible)
            if i in tap_layers and i != last:
                taps[i] = x
        return x, taps

    def _layers_cpu(self, plans, tokens, positions, cache: KVCache, slots, tap_layers) -> tuple[torch.Tensor, dict]:
        """The same through the C++ layer (model/cpu_layers.py), rows of each sequence consecutive."""
        b, t = tokens.shape
        x = self.embed(tokens).reshape(b * t, -1).contiguous()  # [B*T, H], updated in place by the layers
        starts = positions[:, 0].contiguous()
        if b == 1:
            cos, sin = self.rotary.rows(int(starts[0]), t, x.dtype)
        else:
            cos, sin = self.rotary.at(positions.reshape(-1), x.dtype)
        slots = slots.to(torch.int64).contiguous()
        taps = TapBuffer(x, b, t, tap_layers, len(plans) - 1) if tap_layers else {}  # none: no buffer (AR passes)
        cpu_layers.run_layers(plans, x, None, None, cache, slots, starts, cos, sin, causal=True,
                              copies=taps.addresses if tap_layers else None)
        return x.view(b, t, -1), taps
