"""Lossless: speculative output == autoregressive output for the same seeds, in ragged batches — the reference
loop (pure torch) against plain AR, and the engine (scheduler + the CPU backend's runners) against both."""

import pytest
from scripted import ScriptedDraft, ScriptedRunner

from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.reference import speculative_generate
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.runtime.backends import pair_runners
from dflash_trt.runtime.generate import Engine, capacity_for
from dflash_trt.runtime.scheduler import ServiceLimits


@pytest.fixture(scope="module", params=[0.0, 0.7, 1.0])
def ar_case(request, loaded_tiny_pair, make_requests):
    requests = make_requests(request.param, seed=int(request.param * 10))
    return requests, autoregressive_generate(loaded_tiny_pair.target, requests)


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_spec_decode_matches_autoregressive(ar_case, loaded_tiny_pair, block_size):
    requests, ar = ar_case
    scripts = [list(r.prompt) + res.tokens for r, res in zip(requests, ar)]
    draft = ScriptedDraft(loaded_tiny_pair.draft, scripts, corrupt=0.25, seed=block_size)
    spec = speculative_generate(loaded_tiny_pair.target, draft, requests, block_size, propose=draft.propose)
    for i, (a, s) in enumerate(zip(ar, spec)):
        assert s.tokens == a.tokens, f"request {i} diverged"
        assert s.finish_reason == a.finish_reason
    accepted = {x for s in spec for x in s.accepted_drafts}
    assert len(accepted) >= min(block_size, 3), "scripted drafts should give varied acceptance"


def _engine(pair, requests, block_size, **limits):
    limits = ServiceLimits(len(requests), capacity_for(requests), block_size, **limits)
    return Engine(*pair_runners(pair, limits), limits)


@pytest.mark.parametrize("block_size", [4, 16])
def test_the_engine_matches_the_reference_loop_and_autoregressive(ar_case, loaded_tiny_pair, block_size):
    """The engine (CPU runners, measured widths, confidence cut) with scripted drafts and with the real drafter:
    the tokens of AR and of the reference loop, request by request, in one ragged batch."""
    requests, ar = ar_case
    scripts = [list(r.prompt) + res.tokens for r, res in zip(requests, ar)]
    engine = _engine(loaded_tiny_pair, requests, block_size, draft_confidence=0.1)
    engine.scheduler.draft = ScriptedRunner(engine.scheduler.draft, scripts, corrupt=0.25, seed=block_size, sharp=True)
    scripted = engine.generate(requests)
    real = _engine(loaded_tiny_pair, requests, block_size).generate(requests)
    reference = speculative_generate(loaded_tiny_pair.target, loaded_tiny_pair.draft, requests, block_size)
    for i, a in enumerate(ar):
        assert scripted[i].tokens == real[i].tokens == reference[i].tokens == a.tokens, f"request {i} diverged"
        assert scripted[i].finish_reason == a.finish_reason
    assert max(a for r in scripted for a in r.accepted_drafts) > 1


def test_spec_decode_with_real_random_draft_matches_autoregressive(ar_case, loaded_tiny_pair):
    requests, ar = ar_case
    spec = speculative_generate(loaded_tiny_pair.target, loaded_tiny_pair.draft, requests, 4)
    assert [s.tokens for s in spec] == [a.tokens for a in ar]


def test_stop_token_inside_accepted_block_drops_the_rest(loaded_tiny_pair):
    request = Request((1, 2, 3), stop=StopCriteria(30))
    full = autoregressive_generate(loaded_tiny_pair.target, [request])[0].tokens
    stop_at = 6
    stopping = Request((1, 2, 3), stop=StopCriteria(30, frozenset({full[stop_at]})))
    first = full.index(full[stop_at])
    draft = ScriptedDraft(loaded_tiny_pair.draft, [[1, 2, 3] + full], corrupt=0.0)
    out = speculative_generate(loaded_tiny_pair.target, draft, [stopping], 16, propose=draft.propose)[0]
    assert out.tokens == full[: first + 1] and out.finish_reason == "stop"
    engine = _engine(loaded_tiny_pair, [stopping], 16)
    engine.scheduler.draft = ScriptedRunner(engine.scheduler.draft, [[1, 2, 3] + full], corrupt=0.0)
    served = engine.generate([stopping])[0]
    assert served.tokens == out.tokens and served.finish_reason == "stop" and served.accepted_drafts[0] > stop_at


def test_the_last_block_narrows_to_what_remains(loaded_tiny_pair):
    """z-lab's dflash_generate verifies min(block_size, what is left): so do we, in the reference loop and in
    the engine — fewer verify rows, the same tokens."""
    requests = [Request((1, 2, 3, 4), SamplingParams(), StopCriteria(n)) for n in (1, 2, 3, 5, 9)]
    ar = autoregressive_generate(loaded_tiny_pair.target, requests)
    local = []
    for i, (r, a) in enumerate(zip(requests, ar)):
        draft = ScriptedDraft(loaded_tiny_pair.draft, [[1, 2, 3, 4] + a.tokens], corrupt=0.3, seed=i)
        local.append(speculative_generate(loaded_tiny_pair.target, draft, [r], 16, propose=draft.propose)[0])
    served = [_engine(loaded_tiny_pair, [r], 16, width_policy="schedule").generate([r])[0] for r in requests]
    for request, a, results in zip(requests, ar, zip(local, served)):
        for result in results:
            assert result.tokens == a.tokens
            bound, remaining = 0, request.stop.max_new_tokens - 1  # the prefill chose the first token
            for committed in result.acceptance_lengths:  # each step verifies at most what remains
                bound, remaining = bound + remaining - 1, remaining - committed
            assert result.draft_tokens <= bound, (request.stop, result.draft_tokens, bound)
    assert any(r.accepted_drafts and max(r.accepted_drafts) > 0 for r in local)
