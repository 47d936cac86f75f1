"""Bad words (TensorRT-LLM's `bad_words`) are part of the sampling rule: speculative == AR with them,
greedy and sampled, in ragged batches and in the scheduler, and the output never contains a bad word."""

import random
from dataclasses import replace

import pytest
from scripted import ScriptedDraft, ScriptedRunner

from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.bad_words import banned_ids, block_bans
from dflash_trt.decoding.reference import speculative_generate
from dflash_trt.runtime.local import local_engine
from dflash_trt.runtime.service import DFlashService, ServiceLimits


def test_banned_ids_follow_trtllm_ban_rule():
    words = ((7,), (3, 4), (1, 2, 9))
    assert banned_ids(words, [5, 6]) == [7]  # one-token words: always
    assert banned_ids(words, [5, 3]) == [7, 4]  # (3, 4): 4 banned right after 3
    assert banned_ids(words, [1, 2]) == [7, 9]
    assert banned_ids(words, [2]) == [7]  # (1, 2, 9) needs both 1 and 2 before
    # row i of a block [bonus, d1, d2] follows context + block[:i+1]
    assert block_bans(words, [0, 1], [2, 3, 5]) == [[7, 9], [7, 4], [7]]


def _generated(prompt: tuple[int, ...], tokens: list[int], word: tuple[int, ...]) -> bool:
    """Whether some generated token completes `word` (its earlier tokens may be the prompt's)."""
    sequence = list(prompt) + tokens
    n = len(word)
    return any(tuple(sequence[k - n + 1:k + 1]) == word for k in range(max(len(prompt), n - 1), len(sequence)))


def _with_bad_words(requests, plain_results, seed: int):
    """Each request banned from what it would otherwise write: one frequent token and one 2-token
    sequence taken from its own unbanned output (so the bans bite), every third request unbanned."""
    rng = random.Random(seed)
    out = []
    for i, (request, result) in enumerate(zip(requests, plain_results)):
        tokens = result.tokens
        if i % 3 == 2 or len(tokens) < 3:
            out.append(request)
            continue
        j = rng.randrange(len(tokens) - 1)
        words = ((tokens[rng.randrange(len(tokens))],), (tokens[j], tokens[j + 1]))
        out.append(replace(request, bad_words=words))
    return out


@pytest.fixture(scope="module", params=[0.0, 0.8])
def banned_case(request, loaded_tiny_pair, make_requests):
    plain = make_requests(request.param, n=18, seed=int(request.param * 10) + 3)
    unbanned = autoregressive_generate(loaded_tiny_pair.target, plain)
    requests = _with_bad_words(plain, unbanned, seed=1)
    return requests, unbanned, autoregressive_generate(loaded_tiny_pair.target, requests)


def test_autoregressive_output_never_contains_a_bad_word(banned_case):
    requests, unbanned, ar = banned_case
    changed = 0
    for request, before, after in zip(requests, unbanned, ar):
        for word in request.bad_words:
            assert _generated(request.prompt, before.tokens, word)  # the ban bites: unbanned, it is written
            assert not _generated(request.prompt, after.tokens, word)
        changed += before.tokens != after.tokens
    assert changed >= len(requests) // 2, "the bans should change most banned requests' output"


@pytest.mark.parametrize("block_size", [4, 16])
def test_speculative_with_bad_words_matches_autoregressive(banned_case, loaded_tiny_pair, block_size):
    requests, _, ar = banned_case
    spec = speculative_generate(loaded_tiny_pair.target, loaded_tiny_pair.draft, requests, block_size)
    assert [s.tokens for s in spec] == [a.tokens for a in ar]
    # drafts that propose the banned continuations: still the AR tokens, in the reference loop and in the
    # engine (measured widths, AR steps among draft steps)
    _, unbanned, _ = banned_case
    unbanned_scripts = [list(r.prompt) + u.tokens for r, u in zip(requests, unbanned)]
    scripted = ScriptedDraft(loaded_tiny_pair.draft, unbanned_scripts, corrupt=0.3, seed=block_size)
    spec = speculative_generate(loaded_tiny_pair.target, scripted, requests, block_size, propose=scripted.propose)
    assert [s.tokens for s in spec] == [a.tokens for a in ar]
    engine = local_engine(loaded_tiny_pair, 128, block_size, width_policy="measured", max_batch_size=len(requests))
    engine.scheduler.draft = ScriptedRunner(engine.scheduler.draft, unbanned_scripts, corrupt=0.3, seed=block_size)
    assert [s.tokens for s in engine.generate(requests)] == [a.tokens for a in ar]


def test_scheduler_with_bad_words_matches_autoregressive(banned_case, loaded_tiny_pair):
    requests, _, ar = banned_case
    svc = DFlashService(loaded_tiny_pair, ServiceLimits(max_batch_size=4, max_seq_len=128, block_size=8))
    try:
        got = svc.generate(requests)
    finally:
        svc.shutdown()
    assert [g.tokens for g in got] == [a.tokens for a in ar]
    assert [g.finish_reason for g in got] == [a.finish_reason for a in ar]


def test_scheduler_refuses_bad_words_outside_the_vocabulary(loaded_tiny_pair, make_requests):
    svc = DFlashService(loaded_tiny_pair, ServiceLimits(max_batch_size=2, max_seq_len=128, block_size=4))
    try:
        request = replace(make_requests(0.0, n=1)[0], bad_words=((10**6,),))
        with pytest.raises(ValueError, match="bad_words: token ids \\[1000000\\] outside the vocabulary"):
            svc.submit(request, lambda e: None)
    finally:
        svc.shutdown()
