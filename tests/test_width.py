"""Adaptive verify width: picks the best expected throughput and never changes the tokens."""

from scripted import ScriptedDraft
from test_lossless import _requests

from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.decode import speculative_generate
from dflash_trt.decoding.width import AdaptiveWidth
from dflash_trt.runtime.service import DFlashService, ServiceLimits


def test_width_follows_measured_acceptance_and_cost():
    w = AdaptiveWidth(16, cost_tokens=28, explore_every=0)
    assert w.width() == 16  # optimistic before any evidence
    for _ in range(200):  # drafts 1..3 usually accepted, the rest never
        w.update([3, 3, 2, 3], drafts=15)
    assert 3 <= w.width() <= 5
    rows = [15] + [3] * 9  # one row in ten accepts everything: late positions are rarely but sometimes right
    cheap, dear = AdaptiveWidth(16, cost_tokens=1000, explore_every=0), AdaptiveWidth(16, cost_tokens=28, explore_every=0)
    for _ in range(200):
        cheap.update(rows, drafts=15)
        dear.update(rows, drafts=15)
    assert cheap.width() == 16  # extra verified tokens nearly free: take every expected token
    assert dear.width() < 16
    explorer = AdaptiveWidth(16, cost_tokens=28, decay=0.3, explore_every=4)
    widths = []
    for _ in range(8):
        widths.append(explorer.width())
        explorer.update([0], drafts=widths[-1] - 1)
    assert widths[0] == widths[4] == 16 and widths[5:] == [2, 2, 2]  # exploration every 4th step


def test_adaptive_width_is_lossless_in_the_reference_loop(loaded_tiny_pair):
    requests = _requests(0.8, n=12, seed=41)
    expected = autoregressive_generate(loaded_tiny_pair.target, requests)
    scripts = [list(r.prompt) + e.tokens for r, e in zip(requests, expected)]
    draft = ScriptedDraft(loaded_tiny_pair.draft, scripts, corrupt=0.3)
    width = AdaptiveWidth(8, cost_tokens=6, explore_every=5)
    got = speculative_generate(loaded_tiny_pair.target, draft, requests, 8, width=width)
    assert [g.tokens for g in got] == [e.tokens for e in expected]
    assert width.steps > 0 and width.accept[0] < 1.0


def test_adaptive_width_is_lossless_in_the_scheduler(loaded_tiny_pair):
    svc = DFlashService(loaded_tiny_pair, ServiceLimits(max_batch_size=4, max_seq_len=128, block_size=8,
                                                        adaptive_width_cost=4.0))
    try:
        requests = _requests(0.0, n=6, seed=43)
        got = svc.generate(requests)
        assert [g.tokens for g in got] == [e.tokens for e in autoregressive_generate(loaded_tiny_pair.target, requests)]
        assert svc.scheduler.adaptive.steps > 0
    finally:
        svc.shutdown()
