"""The sampling rule every decoding path shares (torch reference; CUDA kernel; AR baseline).

The token at absolute position p of a request with seed s is

    argmax_v  logits_p[v] / T + g(s, p, v)      over the top-k / top-p survivors v,

with g(s, p, v) = -log(-log(u)), u a uniform variate from a counter-based hash of (s, p, v).
T = 0 is plain argmax. The choice depends only on (logits_p, s, p), never on batch composition
or on how many tokens were drafted, which is what makes speculative decoding lossless at any
temperature (Gumbel-max: the argmax is distributed as softmax(logits / T) over the survivors).

Exact definitions (the CUDA kernel implements the same ones):
- logits are upcast to fp32; NaN counts as -inf; a row of all -inf picks token 0. Logits must
  otherwise be finite (+inf is not a probability and is not given a meaning).
- top-k (k > 0): survivors are v with logit_v >= the k-th largest logit (ties at the edge stay).
- top-p (p < 1): over the top-k survivors, probs = softmax(logits / T); v survives iff the mass
  of survivors with strictly larger probability is < top_p (ties are kept or dropped together).
- argmax ties resolve to the lowest token id.

BIT-EXACTNESS: the uniform u comes from 32-bit integer mixing, exact everywhere. The two logs use
`log_f32`, a polynomial built only from IEEE-rounded +, *, / and frexp, so the CUDA kernel (which
uses __fadd_rn / __fmul_rn / __fdiv_rn, never contracted into FMAs) gets identical bits.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF
_LN2 = 0.6931471805599453


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling settings. temperature 0 = greedy; top_k 0 and top_p 1 = off."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not (self.temperature >= 0.0) or self.temperature != self.temperature:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 = off), got {self.top_k}")
        if not (0 <= self.seed < 2**64):
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


# ---------------------------------------------------------------------------
# Counter-based random numbers
# ---------------------------------------------------------------------------

def mix32(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 integer hash on uint32 values held in int64 (wrapping multiply, then mask)."""
    x = x & _MASK32
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def counter_hash(seed: torch.Tensor, position: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """32-bit hash of (seed: uint64, position, vocab id), broadcast; int64 holding uint32."""
    seed_lo = seed & _MASK32
    seed_hi = (seed >> 32) & _MASK32  # seed < 2**64 is stored as int64 two's complement
    h = mix32(seed_lo ^ 0x9E3779B9)
    h = mix32(h ^ seed_hi)
    h = mix32(h ^ (position & _MASK32))
    return mix32(h ^ (vocab & _MASK32))


def log_f32(x: torch.Tensor) -> torch.Tensor:
    """Natural log of positive float32 values from IEEE-rounded ops only (bit-reproducible).

    x = m * 2**e with m in [sqrt(.5), sqrt(2)); log(m) = 2 atanh(s), s = (m - 1) / (m + 1),
    summed as an odd series in s (|s| < 0.172, truncation error < 1e-10, far below fp32 ulp).
    """
    m, e = torch.frexp(x)
    small = m < 0.70710678118654752
    m = torch.where(small, m * 2.0, m)
    e = torch.where(small, e - 1, e).to(torch.float32)
    s = (m - 1.0) / (m + 1.0)
    s2 = s * s
    series = torch.full_like(s, 1.0 / 13.0)
    for k in (11.0, 9.0, 7.0, 5.0, 3.0, 1.0):
        series = series * s2 + 1.0 / k
    return e * _LN2 + (s * 2.0) * series


def gumbel(seed: torch.Tensor, position: torch.Tensor, vocab: torch.Tensor) -> torch.Tensor:
    """Gumbel(0, 1) variates g(s, p, v) = -log(-log(u)), u = (h >> 9 + 0.5) / 2**23 in (0, 1)."""
    h = counter_hash(seed, position, vocab)
    u = ((h >> 9).to(torch.float32) + 0.5) * (1.0 / 8388608.0)
    return -log_f32(-log_f32(u))


def seed_as_int64(seed: int) -> int:
    """Store a uint64 seed in an int64 tensor slot (two's complement)."""
    return seed - 2**64 if seed >= 2**63 else seed


# ---------------------------------------------------------------------------
# The rule
# ---------------------------------------------------------------------------

def survivors(scores: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Boolean mask of tokens kept by top-k then top-p.  scores: [N, V] (= logits / T, fp32)."""
    keep = scores > float("-inf")
    vocab = scores.shape[-1]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab))
    sorted_scores = scores.sort(dim=-1, descending=True).values  # [N, V]
    kth = sorted_scores.gather(-1, (k - 1).clamp(min=0)[:, None])  # [N, 1]
    keep &= scores >= kth
    if bool((top_p < 1.0).any()):
        masked = scores.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(masked, dim=-1)
        sorted_probs = probs.sort(dim=-1, descending=True).values
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        in_nucleus = mass_before < top_p[:, None]
        # Smallest kept probability; ties with it stay (value-based, order-free rule).
        threshold = sorted_probs.masked_fill(~in_nucleus, float("inf")).min(dim=-1).values
        keep &= (probs >= threshold[:, None]) | (top_p[:, None] >= 1.0)
    return keep


def sample_tokens(
    logits: torch.Tensor,  # [N, V] any float dtype
    positions: torch.Tensor,  # [N] int64: absolute position of the token being chosen
    temperature: torch.Tensor,  # [N] fp32
    top_k: torch.Tensor,  # [N] int64
    top_p: torch.Tensor,  # [N] fp32
    seed: torch.Tensor,  # [N] int64 (uint64 bits)
) -> torch.Tensor:  # [N] int64
    """Apply the sampling rule row by row; greedy rows (T = 0) take the plain argmax."""
    logits = logits.float().nan_to_num(nan=float("-inf"), posinf=float("inf"))
    tokens = logits.argmax(dim=-1)
    sampled = temperature > 0
    if not bool(sampled.any()):
        return tokens
    rows = sampled.nonzero(as_tuple=True)[0]
    scores = logits[rows] / temperature[rows, None]
    keep = survivors(scores, top_k[rows], top_p[rows])
    vocab = torch.arange(logits.shape[-1], dtype=torch.int64, device=logits.device)
    g = gumbel(seed[rows, None], positions[rows, None], vocab[None, :])
    perturbed = (scores + g).masked_fill(~keep, float("-inf"))
    tokens[rows] = perturbed.argmax(dim=-1)
    return tokens


def params_tensors(params: list[SamplingParams], device: torch.device | str = "cpu"):
    """Stack per-request params into the [N] tensors `sample_tokens` takes."""
    return (
        torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
        torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
        torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        torch.tensor([seed_as_int64(p.seed) for p in params], dtype=torch.int64, device=device),
    )
