"""The sampling rule: distribution, survivor sets, determinism and edge cases."""

import math

import pytest
import torch

from dflash_trt.decoding.sampling import (
    SamplingParams,
    counter_hash,
    gumbel,
    log_f32,
    sample_tokens,
    seed_as_int64,
    survivors,
)

scipy_stats = pytest.importorskip("scipy.stats")
LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.6, 0.2, -0.3, -1.0, -2.5])


def _draw(logits, n, temperature, top_k=0, top_p=1.0, seed=1234):
    """n draws: one fixed seed, n distinct positions (each position is an independent draw)."""
    rows = logits.expand(n, -1)
    positions = torch.arange(n, dtype=torch.int64)
    full = lambda v, dt: torch.full((n,), v, dtype=dt)  # noqa: E731
    return sample_tokens(rows, positions, full(temperature, torch.float32), full(top_k, torch.int64),
                         full(top_p, torch.float32), full(seed, torch.int64))


def _expected(logits, temperature, top_k, top_p):
    keep = survivors((logits / temperature)[None], torch.tensor([top_k]), torch.tensor([top_p]))[0]
    probs = torch.softmax((logits / temperature).masked_fill(~keep, float("-inf")), dim=-1)
    return probs, keep


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 4, 1.0), (1.0, 0, 0.8), (0.9, 5, 0.7)])
def test_token_frequencies_match_softmax_over_survivors(temperature, top_k, top_p):
    n = 40_000
    tokens = _draw(LOGITS, n, temperature, top_k, top_p)
    probs, keep = _expected(LOGITS, temperature, top_k, top_p)
    counts = torch.bincount(tokens, minlength=len(LOGITS)).double()
    assert counts[~keep].sum() == 0, "a token outside the top-k / top-p set was sampled"
    kept = probs[keep].double()
    observed, expected = counts[keep].numpy(), (kept / kept.sum() * n).numpy()
    assert scipy_stats.chisquare(observed, expected).pvalue > 1e-3


def test_top_k_keeps_ties_at_the_edge():
    scores = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    keep = survivors(scores, torch.tensor([2]), torch.tensor([1.0]))
    assert keep.tolist() == [[True, False, True, True, False]]


def test_top_p_keeps_smallest_prefix_reaching_p_and_ties_together():
    probs = torch.tensor([0.4, 0.2, 0.2, 0.1, 0.1])
    keep = survivors(probs.log()[None], torch.tensor([0]), torch.tensor([0.5]))
    assert keep.tolist() == [[True, True, True, False, False]]  # 0.4 < .5 -> next tie group kept whole
    keep = survivors(probs.log()[None], torch.tensor([0]), torch.tensor([0.4]))
    assert keep.tolist() == [[True, False, False, False, False]]


def test_greedy_is_argmax_with_lowest_id_on_ties_and_ignores_nan():
    logits = torch.tensor([[1.0, 5.0, 5.0, float("nan")], [float("-inf")] * 4])
    zeros = torch.zeros(2)
    tokens = sample_tokens(logits, torch.zeros(2, dtype=torch.int64), zeros, torch.zeros(2, dtype=torch.int64),
                           torch.ones(2), torch.zeros(2, dtype=torch.int64))
    assert tokens.tolist() == [1, 0]


def test_sampled_choice_ignores_nan_and_minus_inf():
    logits = torch.tensor([float("nan"), 0.0, float("-inf"), 0.0]).expand(2000, -1)
    tokens = _draw(logits[0], 2000, 1.0)
    assert set(tokens.tolist()) == {1, 3}


def test_choice_depends_only_on_seed_position_and_logits():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    args = (torch.arange(6) + 10, torch.full((6,), 0.8), torch.zeros(6, dtype=torch.int64),
            torch.full((6,), 0.95), torch.arange(6) * 7)
    batch = sample_tokens(logits, *args)
    alone = [int(sample_tokens(logits[i : i + 1], *(a[i : i + 1] for a in args))) for i in range(6)]
    assert batch.tolist() == alone
    other_seed = sample_tokens(logits, *args[:4], args[4] + 1)
    assert other_seed.tolist() != batch.tolist()


def test_log_f32_matches_math_log_to_float_precision():
    x = torch.cat([torch.rand(10_000) + 1e-7, torch.rand(1000) * 30, torch.tensor([1.0, 2.0, 0.5, 1e-30, 3e38])])
    ref = torch.tensor([math.log(float(v)) for v in x], dtype=torch.float64)
    err = (log_f32(x).double() - ref).abs() / ref.abs().clamp(min=1e-3)
    assert err.max() < 1e-6


def test_uniform_hash_is_balanced_and_seed_uses_all_64_bits():
    h = counter_hash(torch.tensor(5), torch.arange(100_000), torch.tensor(3))
    assert abs(((h >> 31) & 1).float().mean().item() - 0.5) < 0.01
    high = seed_as_int64(2**63 + 5)
    assert counter_hash(torch.tensor(high), torch.tensor(1), torch.tensor(2)) != counter_hash(
        torch.tensor(5), torch.tensor(1), torch.tensor(2))
    g = gumbel(torch.tensor(0), torch.arange(50_000), torch.tensor(0))
    assert abs(g.mean().item() - 0.5772) < 0.02  # Euler–Mascheroni constant


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1), dict(seed=-1)])
def test_sampling_params_reject_out_of_range(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_the_pruned_gumbel_argmax_equals_drawing_noise_for_every_token():
    """perturbed_argmax draws g only where a token can still win; it must pick what the full draw picks."""
    from dflash_trt.decoding.sampling import GUMBEL_MAX, gumbel, perturbed_argmax, survivors

    g = torch.Generator().manual_seed(5)
    n, v = 400, 257
    scales = torch.tensor([0.01, 0.3, 1.0, 4.0, 30.0]).repeat(n // 5)[:, None]
    scores = torch.randn(n, v, generator=g) * scales
    scores[::7, ::3] = float("-inf")
    scores[3, :] = float("-inf")  # nothing survives: token 0
    scores[5, 17] = scores[5, 40] = float("inf")  # +inf: the lowest such id
    scores[9] = 0.0  # exactly flat
    top_k = torch.randint(0, 20, (n,), generator=g) * (torch.rand(n, generator=g) < 0.3)
    top_p = torch.where(torch.rand(n, generator=g) < 0.3, torch.rand(n, generator=g), torch.ones(n))
    keep = survivors(scores, top_k, top_p)
    seed = torch.randint(-2**62, 2**62, (n,), generator=g)
    positions = torch.randint(0, 10_000, (n,), generator=g)
    vocab = torch.randperm(50_000, generator=g)[:v]  # a draft vocabulary's own ids
    full = (scores + gumbel(seed[:, None], positions[:, None], vocab[None, :])).masked_fill(~keep, float("-inf"))
    assert torch.equal(perturbed_argmax(scores, keep, seed, positions, vocab), full.argmax(dim=-1))
    assert 16.6 < GUMBEL_MAX < 16.7
    u = torch.tensor([((1 << 23) - 0.5) / 8388608.0, 0.5 / 8388608.0])
    from dflash_trt.decoding.sampling import log_f32

    assert float((-log_f32(-log_f32(u))).max()) < GUMBEL_MAX  # no hash value gives a larger g
