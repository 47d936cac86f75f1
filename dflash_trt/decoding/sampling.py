"""The sampling rule every decoding path shares (torch reference; CUDA kernel; AR baseline).

The token at absolute position p of a request with seed s is

    argmax_v  logits_p[v] / T + g(s, p, v)      over the top-k / top-p survivors v,

with g(s, p, v) = -log(-log(u)), u a uniform variate from a counter-based hash of (s, p, v).
T = 0 is plain argmax. The choice depends only on (logits_p, s, p), never on batch composition
or on how many tokens were drafted, which is what makes speculative decoding lossless at any
temperature (Gumbel-max: the argmax is distributed as softmax(logits / T) over the survivors).

Exact definitions (the CUDA kernel implements the same ones):
- logits are upcast to fp32; NaN counts as -inf; -inf tokens are never chosen (a row of all
  -inf picks token 0). +inf is not a probability and is given no meaning.
- top-k (k > 0): survivors are v with score_v = logit_v / T >= the k-th largest score (ties at
  the edge stay).
- top-p (p < 1), in exact fixed point so every implementation keeps the same set: over the top-k
  survivors with m = max score, e_v = exp_f32(score_v - m), Z = sum of round(e_v * 2^40) (int64),
  prob_v = e_v * (1 / (Z * 2^-40)), P_v = round(prob_v * 2^62) (int64). v survives iff the integer
  mass of survivors with prob strictly larger than prob_v is < ceil(top_p * 2^62): ties are kept or
  dropped together, and no float summation order is involved. top_p NaN or <= 0 keeps nothing.
- argmax ties resolve to the lowest token id.

BIT-EXACTNESS: the uniform u comes from 32-bit integer mixing, exact everywhere. `log_f32` and
`exp_f32` are polynomials built only from IEEE-rounded +, *, /, floor and frexp / exponent bits, so
the CUDA kernel (plugins/dflash_verify: __fadd_rn / __fmul_rn / __fdiv_rn, never contracted into
FMAs) and its CPU twin get identical bits; masses are integer sums, exact in any order.
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


def _pow2(n: torch.Tensor) -> torch.Tensor:
    """2**n as float32 for -126 <= n <= 127 (exact, from the exponent bits)."""
    return ((n.to(torch.int32) + 127) << 23).view(torch.float32)


def exp_f32(x: torch.Tensor) -> torch.Tensor:
    """exp(x) for float32 x <= 0 from IEEE-rounded ops (softmax numerators; bit-reproducible).

    Cody-Waite reduction x = n ln2 + r (ln2 split so t * hi is exact), degree-7 Taylor in r,
    scaled by 2**n (in two exact steps below 2**-125, so subnormals round once). 0 for x <= -104.
    """
    live = x > -104.0
    x = torch.where(live, x, torch.zeros_like(x))
    t = torch.floor(x * 1.44269502162933349609375 + 0.5)
    r = (x - t * 0.693145751953125) - t * 1.42860682030941723212e-6
    p = torch.full_like(r, 1.0 / 5040.0)
    for c in (1.0 / 720.0, 1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0):
        p = p * r + c
    n = t.to(torch.int32)
    small = (p * _pow2(torch.full_like(n, -64))) * _pow2((n + 64).clamp(min=-126))
    out = torch.where(n >= -125, p * _pow2(n.clamp(min=-126)), small)
    return torch.where(live, out, torch.zeros_like(out))


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

def survivors(scores: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, dense: bool = False) -> torch.Tensor:
    """Boolean mask of tokens kept by top-k then top-p.  scores: [N, V] (= logits / T, fp32). `dense`: every rule
    on every row, no value read back to decide what to skip (the same mask)."""
    keep = scores > float("-inf")
    vocab = scores.shape[-1]
    k = torch.where((top_k > 0) & (top_k < vocab), top_k, torch.full_like(top_k, vocab))
    nucleus = ~(top_p >= 1.0)  # top_p < 1, or NaN
    if dense:
        kth = scores.sort(dim=-1, descending=True).values.gather(-1, (k - 1)[:, None])  # k = V: the smallest
        keep &= scores >= kth
        return torch.where(nucleus[:, None], keep & _nucleus(scores, keep, top_p), keep)
    if bool((k < vocab).any()):  # top-k on: the k-th largest score of each row (k = V keeps every finite one)
        kth = scores.topk(int(k.max()), dim=-1).values.gather(-1, (k - 1).clamp(min=0)[:, None])  # [N, 1]
        keep &= scores >= kth
    if bool(nucleus.any()):
        keep[nucleus] &= _nucleus(scores[nucleus], keep[nucleus], top_p[nucleus])
    return keep


def _nucleus(scores: torch.Tensor, keep: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """The exact fixed-point top-p rule (module docstring) over the top-k survivors `keep`."""
    m = scores.masked_fill(~keep, float("-inf")).max(dim=-1, keepdim=True).values
    e = exp_f32(torch.where(keep, scores - m, torch.full_like(scores, float("-inf"))))  # [N, V]
    z = torch.where(keep, torch.round(e * 1099511627776.0).to(torch.int64), 0).sum(dim=-1, keepdim=True)
    prob = e * (1.0 / (z.to(torch.float32) * (1.0 / 1099511627776.0)))
    mass = torch.where(keep, torch.round(prob * 4611686018427387904.0).to(torch.int64), 0)
    threshold = torch.ceil(top_p.double() * 4611686018427387904.0).nan_to_num(0.0).clamp(min=0).to(torch.int64)
    order = torch.where(keep, prob, torch.full_like(prob, -1.0)).sort(dim=-1, descending=True)
    sorted_mass = mass.gather(-1, order.indices)
    above = sorted_mass.cumsum(dim=-1) - sorted_mass  # [N, V] mass before each (first of a tie: strictly larger)
    ok = (above < threshold[:, None]) & (order.values >= 0)
    p_star = order.values.masked_fill(~ok, float("inf")).min(dim=-1, keepdim=True).values
    return keep & (prob >= p_star)


def canonical_logits(logits: torch.Tensor) -> torch.Tensor:
    """fp32 logits with NaN -> -inf (and -inf kept): what every rule below ranks."""
    return logits.float().nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))


def sample_tokens(
    logits: torch.Tensor,  # [N, V] any float dtype
    positions: torch.Tensor,  # [N] int64: absolute position of the token being chosen
    temperature: torch.Tensor,  # [N] fp32
    top_k: torch.Tensor,  # [N] int64
    top_p: torch.Tensor,  # [N] fp32
    seed: torch.Tensor,  # [N] int64 (uint64 bits)
    vocab_ids: torch.Tensor | None = None,  # [V] int64: the token id of each column (default 0..V-1)
    sampled: bool | None = None,  # some row has T > 0, when the caller knows (else read from `temperature`)
) -> torch.Tensor:  # [N] int64: column indices (= token ids without vocab_ids)
    """Apply the sampling rule row by row (the torch reference); greedy rows (T = 0) take the plain argmax.

    `vocab_ids` scores a subset of the vocabulary (the drafter's draft vocabulary): column c stands for
    token vocab_ids[c], which gets that token's noise g(s, p, vocab_ids[c]) and breaks ties by that id,
    so the choice is the full rule's restricted to the subset (the full rule's winner whenever it is in it).
    Decoding paths call `dflash_trt.kernels.sample_tokens`, which runs this or a bit-identical C++ / CUDA body."""
    if sampled is False:
        return canonical_logits(logits).argmax(dim=-1)
    if vocab_ids is None:
        return sample_tokens_reference(logits, positions, temperature, top_k, top_p, seed)
    return by_id(lambda lg, ids: sample_tokens_reference(lg, positions, temperature, top_k, top_p, seed, ids),
                 logits, vocab_ids)


def by_id(choose, logits: torch.Tensor, vocab_ids: torch.Tensor) -> torch.Tensor:
    """`choose(logits, ids)` with the columns in ascending token id (ties go to the lowest id), as columns."""
    order = vocab_ids.argsort()
    # index_select: a plain gather, where logits[:, order] takes advanced indexing's general path
    return order[choose(logits.index_select(1, order), vocab_ids[order])]


def sample_tokens_reference(logits, positions, temperature, top_k, top_p, seed, vocab_ids=None) -> torch.Tensor:
    """The rule in torch (any device): what `sample_tokens` does where the twin does not run."""
    if logits.is_cuda:
        return _sample_dense(logits, positions, temperature, top_k, top_p, seed, vocab_ids)
    logits = canonical_logits(logits)
    tokens = logits.argmax(dim=-1)
    sampled = temperature > 0
    if not bool(sampled.any()):
        return tokens
    rows = sampled.nonzero(as_tuple=True)[0]
    scores = logits[rows] / temperature[rows, None]
    keep = survivors(scores, top_k[rows], top_p[rows])
    vocab = vocab_ids if vocab_ids is not None else torch.arange(logits.shape[-1], dtype=torch.int64,
                                                                  device=logits.device)
    tokens[rows] = perturbed_argmax(scores, keep, seed[rows], positions[rows], vocab)
    return tokens


def _sample_dense(logits, positions, temperature, top_k, top_p, seed, vocab_ids=None) -> torch.Tensor:
    """The same tokens as `sample_tokens_reference`, computed for every row and column: no step depends on a value
    read back from the device (on a GPU each such read is a sync, and none may sit in a CUDA graph), at the price
    of noise for the whole vocabulary of every row, which a GPU pays in one pass. Greedy rows keep their argmax."""
    logits = canonical_logits(logits)
    greedy = logits.argmax(dim=-1)
    sampled = temperature > 0
    scores = logits / torch.where(sampled, temperature, torch.ones_like(temperature))[:, None]
    keep = survivors(scores, top_k, top_p, dense=True)
    vocab = vocab_ids if vocab_ids is not None else torch.arange(logits.shape[-1], dtype=torch.int64,
                                                                  device=logits.device)
    # every survivor's noise: the sparse path draws it only for possible winners, which are the argmax's anyway
    noisy = torch.where(keep, scores + gumbel(seed[:, None], positions[:, None], vocab[None, :]),
                        torch.full_like(scores, float("-inf")))
    return torch.where(sampled, noisy.argmax(dim=-1), greedy)


def _gumbel_max() -> float:
    """The largest g the hash can give (u = (2**23 - 0.5) / 2**23), with margin: no g exceeds it."""
    top = torch.tensor([((1 << 23) - 0.5) / 8388608.0], dtype=torch.float32)
    return float(-log_f32(-log_f32(top))) + 1e-3


GUMBEL_MAX = _gumbel_max()  # ~16.64


def perturbed_argmax(scores: torch.Tensor, keep: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor,
                     vocab: torch.Tensor) -> torch.Tensor:
    """argmax_v (scores + g(seed, position, vocab_v)) over `keep`, computing g only where it can win.

    Exact: with v* the best score of a row, L = scores[v*] + g(v*) is a value some survivor reaches, and
    no g exceeds GUMBEL_MAX, so a survivor with score < L - GUMBEL_MAX is below L whatever its g: the noise
    is drawn only for the others (on a peaked row a handful, on a flat one most of the vocabulary)."""
    masked = scores.masked_fill(~keep, float("-inf"))
    best = masked.argmax(dim=-1)  # [N]
    lower = masked.gather(-1, best[:, None]) + gumbel(seed[:, None], positions[:, None], vocab[best][:, None])
    candidates = keep & (scores >= lower - GUMBEL_MAX)  # [N, V]; every possible winner
    row, col = candidates.nonzero(as_tuple=True)
    perturbed = torch.full_like(scores, float("-inf"))
    perturbed[row, col] = scores[row, col] + gumbel(seed[row], positions[row], vocab[col])
    return perturbed.argmax(dim=-1)


def some_row_samples(temperature: torch.Tensor, known: bool | None = None) -> bool:
    """Whether some row has T > 0: `known` when the caller holds it on the host (on a GPU, reading `temperature`
    back is a sync), else read from `temperature`."""
    return known if known is not None else bool((temperature > 0).any())


def params_tensors(params: list[SamplingParams], device: torch.device | str = "cpu"):
    """Stack per-request params into the [N] tensors `sample_tokens` takes."""
    return (
        torch.tensor([p.temperature for p in params], dtype=torch.float32, device=device),
        torch.tensor([p.top_k for p in params], dtype=torch.int64, device=device),
        torch.tensor([p.top_p for p in params], dtype=torch.float32, device=device),
        torch.tensor([seed_as_int64(p.seed) for p in params], dtype=torch.int64, device=device),
    )
