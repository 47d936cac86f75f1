"""DFlash2's two additions to the DFlash drafter (z-lab `DFlash2DraftModel`, dflash==0.1.0 dflash/model.py,
the same code as z-lab/dflash @07ebd93; tensor names and shapes: z-lab tests/fixtures/dflash2-safetensors-header.json
@0698f537).

Grouped dynamic depthwise causal convolution, around each sublayer (attention and MLP) of every draft layer,
along the block's slots only (the context is never convolved). With H channels in G = H / S groups of S,
kernel length K, and u the sublayer's normed input rows [Q, H] of one block:

    d = kernel_projection(u) -> [Q, 2, K, G]                                (side 0: before, 1: after)
    conv_side(z)[t, c] = sum_{o < K} (base_kernel[side, o, c] + d[t, side, o, c // S]) * z[t - o, c]

with z[t - o] = 0 before the block's slot 0; side 0 convolves the sublayer's input, side 1 its output, both
with coefficients computed from u.

Candidate selector. The draft logits (times output_multiplier, softcapped) give each slot p its top
`selector_top_k` candidates and their unary scores; the drafts are a walk along the block from the
anchor (the bonus token): at slot p, candidate k of token c scores

    unary[p, k] + sum_r P[prev, r] * h[p, r] * S[c, r],     h = hidden_projection(hidden[p])

(P, S: the predecessor / successor codebooks [V, R]) and the best candidate becomes the draft and the
next slot's predecessor. At T > 0 our drafter takes the coupled choice instead, argmax_k score / T +
g(seed, position, c) with the noise the target's sampling rule uses at that position (decoding/drafts.py),
where z-lab samples from softmax(score / T); verification is unchanged either way, so decoding stays
token-identical to AR.
"""

from __future__ import annotations

import torch
from torch import nn


class GroupedDynamicConv(nn.Module):
    """`attention_conv` / `mlp_conv` of a DFlash2 layer: base_kernel [2, K, H], kernel_projection [2*K*G, H]."""

    def __init__(self, hidden_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.kernel_size, self.group_size = kernel_size, group_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel_size, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * kernel_size * self.groups, bias=False)

    def prepare(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(conv_0(u), the side-1 coefficients [B, Q, K, G]) for block rows u [B, Q, H]."""
        b, q, h = u.shape
        d = self.kernel_projection(u.reshape(b * q, h)).view(b, q, 2, self.kernel_size, self.groups)
        return self._convolve(u, d[:, :, 0], 0), d[:, :, 1]

    def finish(self, z: torch.Tensor, coefficients: torch.Tensor) -> torch.Tensor:
        return self._convolve(z, coefficients, 1)

    def _convolve(self, z: torch.Tensor, d: torch.Tensor, side: int) -> torch.Tensor:
        b, q, h = z.shape
        groups = z.view(b, q, self.groups, self.group_size)
        out = torch.zeros_like(groups)
        for o in range(self.kernel_size):
            shifted = groups if o == 0 else torch.nn.functional.pad(groups[:, : q - o], (0, 0, 0, 0, o, 0))
            base = self.base_kernel[side, o].view(1, 1, self.groups, self.group_size).to(z.dtype)
            out = out + base * shifted + d[:, :, o, :, None].to(z.dtype) * shifted
        return out.view(b, q, h)


class CandidateSelector(nn.Module):
    """`candidate_selector`: hidden_projection [R, H], predecessor / successor codebooks [V, R] (stored
    without `.weight`, as z-lab's checkpoints are)."""

    def __init__(self, hidden_size: int, vocab_size: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.hidden_projection = nn.Linear(hidden_size, rank, bias=False)
        self.predecessor_codebook = nn.Parameter(torch.empty(vocab_size, rank))
        self.successor_codebook = nn.Parameter(torch.empty(vocab_size, rank))

    def drafts(self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor, start: torch.Tensor | None = None,
               sampling=None, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Drafts [B, K] (token ids) for block slots 1..K from their hidden rows [B, K, H] and draft logits
        [B, K, V'] (V' columns: the vocabulary, or `vocab_ids`' tokens), walking from `anchor` [B]."""
        from dflash_trt.decoding.sampling import gumbel

        b, k, _ = hidden.shape
        unary, columns = torch.topk(logits.float(), min(self.top_k, logits.shape[-1]), dim=-1)
        candidates = columns if vocab_ids is None else vocab_ids[columns]  # [B, K, top_k] token ids
        projected = self.hidden_projection(hidden.reshape(b * k, -1)).view(b, k, -1).float()
        successor = self.successor_codebook[candidates].float()  # [B, K, top_k, R]
        sampled = sampling is not None and bool((sampling[0] > 0).any())
        if sampled:
            temperature, seed = sampling[0].float(), sampling[3]
            hot = temperature > 0
            scale = torch.where(hot, temperature, torch.ones_like(temperature))[:, None]
        previous, path = anchor, []
        for p in range(k):
            scores = unary[:, p] + torch.einsum("br,bkr->bk", self.predecessor_codebook[previous].float()
                                                * projected[:, p], successor[:, p])
            if sampled:
                position = (start + 1 + p)[:, None].expand_as(candidates[:, p])
                noise = gumbel(seed[:, None].expand_as(position), position, candidates[:, p])
                scores = torch.where(hot[:, None], scores / scale + noise, scores)
            previous = candidates[:, p].gather(-1, scores.argmax(dim=-1, keepdim=True))[:, 0]
            path.append(previous)
        return torch.stack(path, dim=1)
