"""Coupled drafts (decoding/drafts.py): at T > 0 the drafter proposes with the request's own noise.

Lossless because verification is unchanged: every committed token is the target's, token-identical to
autoregressive decoding with the same seed, at every temperature, in ragged batches, with a draft
vocabulary and the confidence cut. And it pays: when the draft's distribution equals the target's, every
coupled draft is accepted; on the shipped pair τ rises over greedy drafts at every T > 0.
"""

import torch

from dflash_trt.decoding.drafts import confident_prefix, coupled_drafts
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams, params_tensors, sample_tokens
from dflash_trt.decoding.verify import verify_block

SETTINGS = [SamplingParams(0.0), SamplingParams(0.7, seed=3), SamplingParams(1.0, 5, 1.0, 2**64 - 5),
            SamplingParams(1.5, 0, 0.9, 17)]


def test_drafts_from_the_target_s_own_distribution_are_all_accepted():
    """q = p: the coupled draft at slot j is the token the target samples at start + j, for every row."""
    g = torch.Generator().manual_seed(0)
    b, k, v = len(SETTINGS), 7, 300
    logits = torch.randn(b, k + 1, v, generator=g) * 2.0
    start = torch.tensor([3, 40, 7, 1000])
    sampling = params_tensors(SETTINGS)
    drafts = coupled_drafts(logits[:, :k], start, sampling)
    tokens, accepted = verify_block(logits, drafts, start, *sampling)
    assert accepted.tolist() == [k] * b and torch.equal(tokens[:, :k], drafts)
    greedy = logits[:, :k].argmax(-1)  # what greedy drafts would have been: the sampled rows reject early
    assert verify_block(logits, greedy, start, *sampling)[1].tolist()[1:] != [k] * (b - 1)


def test_a_draft_vocabulary_gets_each_token_s_own_noise():
    """Over a subset the rule is the full rule restricted to it: the same token whenever the full winner is in it."""
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(64, 500, generator=g)
    positions, (t, k, p, s) = torch.arange(64) + 9, params_tensors([SamplingParams(0.9, seed=11)] * 64)
    full = sample_tokens(logits, positions, t, k, p, s)
    subset = torch.unique(torch.cat([full, torch.randperm(500, generator=g)[:100]]))  # holds every winner
    columns = sample_tokens(logits[:, subset], positions, t, k, p, s, vocab_ids=subset)
    assert torch.equal(subset[columns], full)


def test_the_confidence_cut_reads_each_row_at_its_temperature():
    logits = torch.full((2, 4, 5), -10.0)
    logits[0, :, 0] = 10.0  # a sure greedy row
    logits[1, :2, 1] = 10.0  # a sampled row sure of two slots, then flat
    logits[1, 2:] = 0.0
    columns = torch.tensor([[0, 0, 0, 0], [1, 1, 3, 2]])
    temperature = torch.tensor([0.0, 1.0])
    assert confident_prefix(logits, columns, temperature, 0.5)[0] == 4  # row 0 trusts all four
    assert confident_prefix(logits[1:], columns[1:], temperature[1:], 0.5)[0] == 2
    assert confident_prefix(logits, columns, temperature, 0.0)[0] == 4
    kept, running = confident_prefix(logits[1:, :2], columns[1:, :2], temperature[1:], 0.5)
    assert kept == 2 and confident_prefix(logits[1:, 2:], columns[1:, 2:], temperature[1:], 0.5, running)[0] == 0


def _decode(pair, requests, coupled: bool, slots: int, confidence: float = 0.0):
    """The engine (full blocks) over `slots` slots; `coupled` False: greedy drafts for every row."""
    from dflash_trt.runtime.local import local_engine

    engine = local_engine(pair, max(len(r.prompt) for r in requests) + 64, min_confidence=confidence,
                          width_policy="schedule", max_batch_size=slots)
    if not coupled:
        draft = engine.scheduler.draft
        propose = draft.propose
        draft.propose = lambda *args, **kw: propose(*args[:4])  # no sampling: greedy drafts
    return engine.generate(requests)


def test_coupled_drafts_are_lossless_and_raise_tau_on_the_shipped_pair(shipped_pair):
    from dflash_trt.bench.local import load_prompts
    from dflash_trt.runtime.local import generate

    prompts = load_prompts(None, None, 4)
    taus = {}
    for temperature in (0.7, 1.0, 1.5):
        requests = [Request(tuple(p), SamplingParams(temperature, 0, 1.0, 100 + i), StopCriteria(48))
                    for i, p in enumerate(prompts)]
        expected = [r.tokens for r in generate(shipped_pair, requests, autoregressive=True)[0]]  # the engine's AR
        for coupled in (False, True):
            results = _decode(shipped_pair, requests, coupled, slots=3)  # ragged: 4 requests over 3 slots
            assert [r.tokens for r in results] == expected, (temperature, coupled)
            lengths = [n for r in results for n in r.acceptance_lengths]
            taus[temperature, coupled] = sum(lengths) / len(lengths)
    for temperature in (0.7, 1.0, 1.5):
        assert taus[temperature, True] > taus[temperature, False], taus


def test_coupled_drafts_with_a_draft_vocabulary_and_the_cut_stay_lossless(shipped_pair):
    from dflash_trt.bench.local import load_prompts
    from dflash_trt.decoding.autoregressive import autoregressive_generate
    from dflash_trt.engine.config import ASSETS
    from dflash_trt.model import draft_vocab

    prompts = load_prompts(None, None, 3)
    requests = [Request(tuple(p), SamplingParams(t, 20 if i == 1 else 0, 0.95, 7 + i), StopCriteria(40))
                for i, (p, t) in enumerate(zip(prompts, (0.0, 0.8, 1.2)))]
    expected = [r.tokens for r in autoregressive_generate(shipped_pair.target, requests)]
    ids = draft_vocab.token_ids(ASSETS / "tiny-qwen3-dflash", 1024, shipped_pair.target.config.vocab_size, "test")
    shipped_pair.draft.use_vocab(ids, shipped_pair.target.lm_head)
    try:
        results = _decode(shipped_pair, requests, True, slots=2, confidence=0.05)
    finally:
        shipped_pair.draft.use_vocab(None, shipped_pair.target.lm_head)
    assert [r.tokens for r in results] == expected
