"""Confidence-cut drafting (`confident_drafts`): the rule, lazy reading, and losslessness."""

import math

import pytest
import torch
from scripted import ScriptedRunner

from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.drafts import confident_drafts
from dflash_trt.runtime.local import local_engine
from dflash_trt.runtime.service import DFlashService, ServiceLimits


def _reference_width(logits: torch.Tensor, min_confidence: float) -> int:
    """The rule written plainly in fp64: per row, the longest prefix whose product of softmax maxima
    stays >= min_confidence; the widest row wins; at least one draft."""
    probs = logits.double().softmax(-1).max(-1).values  # [B, K]
    widths = []
    for row in probs:
        product, n = 1.0, 0
        for p in row.tolist():
            product *= p
            if product < min_confidence:
                break
            n += 1
        widths.append(n)
    return max(1, max(widths))


@pytest.mark.parametrize("k", [1, 2, 5, 6, 7, 15])
@pytest.mark.parametrize("rows", [1, 3])
def test_cut_follows_the_rule_and_keeps_the_argmax_prefix(k, rows):
    g = torch.Generator().manual_seed(k * 10 + rows)
    for trial in range(40):
        # rows of varied sharpness: some slots near-certain, some flat
        sharp = torch.rand(rows, k, 1, generator=g) * 12
        logits = torch.randn(rows, k, 50, generator=g)
        logits[..., 0] += sharp[..., 0]
        full = logits.argmax(-1)
        assert torch.equal(confident_drafts(lambda lo, hi: logits[:, lo:hi], k, 0.0), full)
        for theta in (1e-4, 0.05, 0.3, 0.9):
            calls = []

            def logits_of(lo, hi):
                calls.append((lo, hi))
                return logits[:, lo:hi]

            got = confident_drafts(logits_of, k, theta, first=6)
            width = 1 if k == 1 else _reference_width(logits, theta)
            assert got.shape == (rows, width), (trial, theta)
            assert torch.equal(got, full[:, :width])
            # lazy: the slots after the first chunk are read only when some row trusts all of it
            if k > 6 and width < 6:
                assert calls == [(0, 6)]


def test_nan_logits_count_as_no_confidence():
    logits = torch.zeros(1, 4, 8)
    logits[0, :, 2] = 20.0
    logits[0, 2] = float("nan")
    got = confident_drafts(lambda lo, hi: logits[:, lo:hi], 4, 0.5)
    assert got.shape == (1, 2) and got.tolist() == [[2, 2]]
    assert math.isfinite(float(logits[0, 0, 2]))


@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("min_confidence", [0.02, 0.3])
def test_spec_decode_with_confidence_cut_matches_autoregressive(loaded_tiny_pair, make_requests, temperature,
                                                                min_confidence):
    requests = make_requests(temperature, n=24, seed=int(temperature * 10) + 3)
    ar = autoregressive_generate(loaded_tiny_pair.target, requests)
    spec, widths = [], []  # batches of 1 and 2 rows (the widest row sets a batch's block)
    for lo, hi in ((0, 8), (8, 10), (10, 12), (12, 14), (14, 16)) + tuple((i, i + 1) for i in range(16, 24)):
        scripts = [list(r.prompt) + res.tokens for r, res in zip(requests[lo:hi], ar[lo:hi])]
        engine = local_engine(loaded_tiny_pair, 128, 8, min_confidence=min_confidence, width_policy="schedule",
                              max_batch_size=hi - lo)
        engine.scheduler.draft = draft = ScriptedRunner(engine.scheduler.draft, scripts, corrupt=0.2, seed=7, sharp=True)
        spec += engine.generate(requests[lo:hi])
        widths += draft.widths
    assert [s.tokens for s in spec] == [a.tokens for a in ar]
    assert len(set(widths)) >= 3 and min(widths) < 7  # the cut really varies the block
    for s in spec:  # no step accepts more drafts than it verified
        assert max(s.accepted_drafts, default=0) <= max(widths)


def test_service_with_confidence_cut_on_the_shipped_pair(shipped_pair):
    """The trained drafter's cut narrows most steps, keeps most acceptance, and is lossless in a batch."""
    from dflash_trt.bench.local import load_prompts
    from dflash_trt.decoding.requests import Request, StopCriteria
    from dflash_trt.decoding.sampling import SamplingParams

    prompts = load_prompts(None, None, 4)
    requests = [Request(tuple(p), SamplingParams(t, seed=5), StopCriteria(64)) for p, t in zip(prompts, (0, 0, 0.7, 0))]
    expected = autoregressive_generate(shipped_pair.target, requests)
    results, widths = {}, {}
    for theta in (0.0, 0.05):
        svc = DFlashService(shipped_pair, ServiceLimits(max_batch_size=2, max_seq_len=256, block_size=16,
                                                        draft_confidence=theta, width_policy="schedule"))
        seen = []
        verify = svc.scheduler.target.verify
        svc.scheduler.target.verify = lambda slots, blocks, *a, **k: (seen.append(blocks.shape[1]), verify(slots, blocks, *a, **k))[1]
        try:
            results[theta] = svc.generate(requests)
        finally:
            svc.shutdown()
        widths[theta] = seen
        assert [r.tokens for r in results[theta]] == [e.tokens for e in expected]
    assert widths[0.0].count(16) >= 0.6 * len(widths[0.0]), widths[0.0]  # full blocks, but the last ones narrow
    assert sum(widths[0.05]) / len(widths[0.05]) < 12
    steps = {t: sum(len(r.acceptance_lengths) for r in results[t]) for t in results}
    assert steps[0.05] <= 1.15 * steps[0.0]  # the cut drops few accepted drafts
