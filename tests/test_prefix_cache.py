"""The prefix cache: content-addressed blocks of committed tokens holding the target's K/V and the drafter's
context. Lossless cold, warm, partly evicted and off; a warm request's acceptance is the cold one's, bit for bit on
CPU, because the drafter's context of cached positions is restored with the target's K/V."""

import threading

import pytest
import torch

from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.runtime.backends import pair_runners
from dflash_trt.runtime.generate import Engine
from dflash_trt.runtime.prefix_cache import BLOCK, PrefixCache
from dflash_trt.runtime.scheduler import ServiceLimits

# --- the index -------------------------------------------------------------------------------------------------


def test_a_block_matches_only_after_the_same_parents():
    cache = PrefixCache(8)
    a = list(range(3 * BLOCK + 5))
    assert cache.insert(a, len(a)) == [(0, 7), (1, 6), (2, 5)]  # full blocks only, new pool ids
    assert cache.insert(a, len(a)) == []  # already cached: nothing to write
    assert len(cache.match(a, len(a))) == 3 and len(cache.match(a, 3 * BLOCK - 1)) == 2  # the limit is in tokens
    b = [99] + a[1:]  # the same later blocks after another first block: no match at all
    assert cache.match(b, len(b)) == []
    assert cache.stats.queries == len(a) + 3 * BLOCK - 1 + len(b) and cache.stats.hits == 5 * BLOCK


def test_eviction_is_least_recently_used_leaves_first():
    cache = PrefixCache(4)
    a, b = list(range(3 * BLOCK)), list(range(1000, 1000 + 2 * BLOCK))
    cache.insert(a, len(a))
    cache.match(a, len(a))  # touched leaf first: a's root is the most recent of its chain
    new = cache.insert(b, len(b))  # one block free, one to evict: a's leaf, not its root
    assert len(new) == 2 and cache.stats.evictions == 1
    assert len(cache.match(a, len(a))) == 2 and len(cache.match(b, len(b))) == 2
    tiny = PrefixCache(2)
    assert len(tiny.insert(a, len(a))) == 2  # a chain longer than the budget keeps its first blocks
    assert len(tiny.match(a, len(a))) == 2


# --- the engine ------------------------------------------------------------------------------------------------


def _engine(pair, budget: int, slots: int = 4, width_policy: str = "schedule", confidence: float = 0.1):
    limits = ServiceLimits(slots, 1024, draft_confidence=confidence, prefix_cache_bytes=budget,
                           width_policy=width_policy)
    return Engine(*pair_runners(pair, limits), limits)


@pytest.fixture(scope="module")
def agent_requests(shipped_pair):
    """Two agents' requests after one long shared system prompt (20 blocks), greedy and seeded."""
    from dflash_trt.bench.local import load_prompts

    prompts = load_prompts(None, shipped_pair.tokenizer, 12)
    system = sum(prompts[:8], [])[: 20 * BLOCK]
    assert len(system) == 20 * BLOCK
    return [Request(tuple(system + p), SamplingParams(t, seed=7 + i), StopCriteria(48))
            for i, (p, t) in enumerate(zip(prompts[8:12], (0.0, 0.0, 0.8, 1.2)))]


def test_warm_requests_decode_the_cold_tokens_with_the_cold_acceptance(shipped_pair, agent_requests):
    cold = _engine(shipped_pair, 0).generate(agent_requests)
    engine = _engine(shipped_pair, 64 << 20)
    first = engine.generate(agent_requests[:1])  # cold: nothing cached yet
    warm = engine.generate(agent_requests)  # the system prompt (and request 0's whole prompt) cached
    assert first[0].cached_tokens == 0 and all(r.cached_tokens >= 20 * BLOCK for r in warm)
    for c, w in zip(cold, warm):
        assert w.tokens == c.tokens and w.acceptance_lengths == c.acceptance_lengths
    stats = engine.scheduler.prefix.stats
    assert stats.hits >= 4 * 20 * BLOCK and stats.inserted > 20


def test_warm_prompts_prefilled_in_chunks_keep_the_cold_acceptance(shipped_pair, agent_requests):
    """A prompt whose uncached part is longer than the runner's prefill_chunk: cold it is prefilled in chunks
    from position 0, warm in chunks after its restored blocks; both decode the unchunked cold tokens with its
    acceptance, one request at a time."""
    cold = [_engine(shipped_pair, 0, slots=1).generate([r])[0] for r in agent_requests[:2]]
    engine = _engine(shipped_pair, 64 << 20, slots=1)
    engine.scheduler.prefill_chunk = 48
    chunked = [engine.generate([r])[0] for r in agent_requests[:2]]
    assert chunked[0].cached_tokens == 0 and chunked[1].cached_tokens == 20 * BLOCK
    assert len(agent_requests[1].prompt) - 20 * BLOCK > 48  # the warm one's rest took chunks too
    for c, w in zip(cold, chunked):
        assert w.tokens == c.tokens and w.acceptance_lengths == c.acceptance_lengths


@pytest.fixture
def full_attention(shipped_pair):
    """The shipped drafter with its context window lifted, as the full-attention drafters other engines serve
    (its window reads mostly the latest positions, which a restore never covers: the last prompt token runs)."""
    def set_window(value):
        for layer in shipped_pair.draft.layers:
            layer.window = value
            layer.__dict__.pop("_cpu_plan", None)  # a plan carries its layer's window

    window = shipped_pair.draft.layers[0].window
    set_window(None)
    yield shipped_pair
    set_window(window)


def test_a_drafter_reading_stale_context_would_show(full_attention, agent_requests, monkeypatch):
    """The failure other engines ship: cached positions restored for the target but not for the drafter. The
    drafter then reads another request's context at those positions — tokens stay right, acceptance drops.
    With the context restored it is the cold acceptance exactly."""
    shipped_pair, greedy = full_attention, agent_requests[:2]
    cold = _engine(shipped_pair, 0).generate(greedy)
    engine = _engine(shipped_pair, 64 << 20, slots=2)
    engine.generate([Request(tuple(range(40, 40 + 20 * BLOCK)), stop=StopCriteria(8))])  # fills slot 0's context
    engine.generate(greedy[:1])
    monkeypatch.setattr(engine.scheduler.draft, "load_prefix", lambda slot, ids: None)  # target only
    stale = engine.generate(greedy[1:])[0]
    assert stale.cached_tokens >= 20 * BLOCK and stale.tokens == cold[1].tokens
    tau = lambda r: sum(r.acceptance_lengths) / len(r.acceptance_lengths)  # noqa: E731
    assert tau(stale) < 0.9 * tau(cold[1])  # the warm test above would fail on this: it requires the cold steps


def test_partly_evicted_and_concurrent_with_cancellations_stays_lossless(shipped_pair, agent_requests):
    """A budget of a few blocks more than the shared prompt (the requests' own blocks evict each other), four
    requests at once with a fifth cancelled mid-stream:
    every finished request's tokens are the cold ones."""
    from dflash_trt.runtime.service import DFlashService

    cold = _engine(shipped_pair, 0).generate(agent_requests)
    per_block = sum(r.prefix_block_bytes(BLOCK) for r in pair_runners(shipped_pair, ServiceLimits(1, 64))
                    if r is not None)
    svc = DFlashService(shipped_pair, ServiceLimits(4, 1024, draft_confidence=0.1, prefix_cache_bytes=24 * per_block))
    try:
        for _ in range(2):
            stop = threading.Event()
            svc.submit(agent_requests[0], lambda e: stop.set() if e.tokens else None, is_cancelled=stop.is_set)
            assert [r.tokens for r in svc.generate(agent_requests)] == [r.tokens for r in cold]
        assert svc.scheduler.prefix.stats.evictions > 0 and svc.scheduler.prefix.stats.hits > 0
    finally:
        svc.shutdown()


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_pairs_decode_the_same_warm_and_cold(tiny_pair, make_requests, dtype):
    from dflash_trt.model.loader import load_pair

    pair = load_pair(tiny_pair[0], tiny_pair[1], dtype=dtype, device="cpu")
    shared = tuple(range(3, 3 + 4 * BLOCK))
    requests = [Request(shared + r.prompt, r.params, r.stop) for r in make_requests(0.8, n=6, seed=3)]
    cold = _engine(pair, 0, slots=6).generate(requests)
    engine = _engine(pair, 8 << 20, slots=6)
    engine.generate(requests[:2])
    warm = engine.generate(requests)
    assert [w.tokens for w in warm] == [c.tokens for c in cold]
    assert sum(w.cached_tokens for w in warm) >= 6 * 4 * BLOCK
    assert [w.acceptance_lengths for w in warm] == [c.acceptance_lengths for c in cold]


def test_autoregressive_engines_cache_the_target_alone(loaded_tiny_pair, make_requests):
    requests = [Request(tuple(range(5, 5 + 3 * BLOCK)) + r.prompt, r.params, r.stop)
                for r in make_requests(1.0, n=5, seed=9)]
    limits = ServiceLimits(5, 512, block_size=1, prefix_cache_bytes=1 << 20)
    engine = Engine(*pair_runners(loaded_tiny_pair, limits), limits)
    cold = engine.generate(requests)
    warm = engine.generate(requests)
    assert [w.tokens for w in warm] == [c.tokens for c in cold] and min(w.cached_tokens for w in warm) >= 3 * BLOCK
    assert torch.equal(torch.tensor([c.cached_tokens for c in cold]), torch.zeros(5, dtype=torch.int64))
