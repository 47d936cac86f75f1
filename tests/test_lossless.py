"""Lossless: speculative output == autoregressive output for the same seeds, in ragged batches."""

import random

import pytest
from scripted import ScriptedDraft

from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.decode import speculative_generate
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams

VARIANTS = [(0, 1.0), (10, 1.0), (0, 0.9), (40, 0.6), (3, 0.95)]  # (top_k, top_p)


def _requests(temperature: float, n: int = 50, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        top_k, top_p = VARIANTS[i % len(VARIANTS)]
        prompt = tuple(rng.randrange(255) for _ in range(rng.randint(1, 40)))
        stops = frozenset(rng.sample(range(255), 3)) if i % 4 == 0 else frozenset()
        out.append(Request(prompt, SamplingParams(temperature, top_k, top_p, seed=rng.randrange(2**64)),
                           StopCriteria(rng.randint(1, 40), stops)))
    return out


@pytest.fixture(scope="module", params=[0.0, 0.7, 1.0])
def ar_case(request, loaded_tiny_pair):
    requests = _requests(request.param, seed=int(request.param * 10))
    return requests, autoregressive_generate(loaded_tiny_pair.target, requests)


@pytest.mark.parametrize("block_size", [2, 4, 8, 16])
def test_spec_decode_matches_autoregressive(ar_case, loaded_tiny_pair, block_size):
    requests, ar = ar_case
    scripts = [list(r.prompt) + res.tokens for r, res in zip(requests, ar)]
    draft = ScriptedDraft(loaded_tiny_pair.draft, scripts, corrupt=0.25, seed=block_size)
    spec = speculative_generate(loaded_tiny_pair.target, draft, requests, block_size)
    for i, (a, s) in enumerate(zip(ar, spec)):
        assert s.tokens == a.tokens, f"request {i} diverged"
        assert s.finish_reason == a.finish_reason
    accepted = {x for s in spec for x in s.accepted_drafts}
    assert len(accepted) >= min(block_size, 3), "scripted drafts should give varied acceptance"


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
    out = speculative_generate(loaded_tiny_pair.target, draft, [stopping], 16)[0]
    assert out.tokens == full[: first + 1] and out.finish_reason == "stop"


def test_the_last_block_narrows_to_what_remains(loaded_tiny_pair):
    """z-lab's dflash_generate verifies min(block_size, what is left): so do we, locally and in the
    scheduler — fewer verify rows, the same tokens."""
    from dflash_trt.runtime.service import DFlashService, ServiceLimits

    requests = [Request((1, 2, 3, 4), SamplingParams(), StopCriteria(n)) for n in (1, 2, 3, 5, 9)]
    ar = autoregressive_generate(loaded_tiny_pair.target, requests)
    local = [speculative_generate(loaded_tiny_pair.target,
                                  ScriptedDraft(loaded_tiny_pair.draft, [[1, 2, 3, 4] + a.tokens], corrupt=0.3, seed=i),
                                  [r], 16)[0] for i, (r, a) in enumerate(zip(requests, ar))]
    svc = DFlashService(loaded_tiny_pair, ServiceLimits(max_batch_size=1, max_seq_len=64, block_size=16))
    try:
        served = svc.generate(requests)
    finally:
        svc.shutdown()
    for request, a, results in zip(requests, ar, zip(local, served)):
        for result in results:
            assert result.tokens == a.tokens
            bound, remaining = 0, request.stop.max_new_tokens - 1  # the prefill chose the first token
            for committed in result.acceptance_lengths:  # each step verifies at most what remains
                bound, remaining = bound + remaining - 1, remaining - committed
            assert result.draft_tokens <= bound, (request.stop, result.draft_tokens, bound)
    assert any(r.accepted_drafts and max(r.accepted_drafts) > 0 for r in local)
