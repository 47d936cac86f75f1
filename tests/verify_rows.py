"""Rows of logits and sampling parameters shared by the verify-kernel tests (CPU twin and GPU)."""

from __future__ import annotations

import torch

from dflash_trt.decoding.sampling import seed_as_int64

NEG_INF, NAN = float("-inf"), float("nan")


def params(n, temperature=1.0, top_k=0, top_p=1.0, seed=7, position=0):
    full = lambda v, dt: torch.full((n,), v, dtype=dt)  # noqa: E731
    return (full(position, torch.int64), full(temperature, torch.float32), full(top_k, torch.int64),
            full(top_p, torch.float32), full(seed_as_int64(seed), torch.int64))


def random_rows(g: torch.Generator, n: int, vocab: int, dtype: torch.dtype | None = None):
    """n rows of logits [n, V] mixing scales, ties, -inf, NaN, dtypes (`dtype`, else one drawn), and random params."""
    scale = float(torch.rand(1, generator=g)) * 8 + 0.1
    logits = torch.randn(n, vocab, generator=g) * scale
    kind = int(torch.randint(0, 4, (1,), generator=g))
    if kind == 1:
        logits = logits.round()  # many ties
    elif kind == 2:
        logits[torch.rand(n, vocab, generator=g) < 0.05] = NEG_INF
    elif kind == 3:
        logits[torch.rand(n, vocab, generator=g) < 0.05] = NAN
    drawn = (torch.float32, torch.float16, torch.bfloat16)[int(torch.randint(0, 3, (1,), generator=g))]
    logits = logits.to(dtype or drawn)  # drawn either way: the rest of the stream stays the same
    coin = lambda p: torch.rand(n, generator=g) < p  # noqa: E731
    temperature = torch.where(coin(0.2), 0.0, torch.rand(n, generator=g) * 2 + 0.05)
    top_k = torch.where(coin(0.5), 0, torch.randint(1, vocab + 3, (n,), generator=g))
    top_p = torch.where(coin(0.5), 1.0, torch.rand(n, generator=g) * 0.98 + 0.01).float()
    seed = torch.randint(-2**63, 2**63 - 1, (n,), generator=g)  # half of them are seeds >= 2**63
    positions = torch.randint(0, 2**40, (n,), generator=g)
    return logits, positions, temperature, top_k, top_p, seed
