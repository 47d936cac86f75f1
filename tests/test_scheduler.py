"""Continuous batching: requests admitted mid-flight decode exactly their autoregressive tokens."""

import threading
import time

import pytest

from dflash_trt.decoding.autoregressive import autoregressive_generate
from dflash_trt.decoding.requests import Request, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.runtime.service import DFlashService, ServiceLimits


@pytest.fixture(scope="module")
def service(loaded_tiny_pair):
    svc = DFlashService(loaded_tiny_pair, ServiceLimits(max_batch_size=4, max_seq_len=128, block_size=4))
    yield svc
    svc.shutdown()


def test_more_requests_than_slots_match_autoregressive(service, loaded_tiny_pair, make_requests):
    requests = make_requests(0.8, n=14, seed=5)
    expected = autoregressive_generate(loaded_tiny_pair.target, requests)
    got = service.generate(requests)
    assert [g.tokens for g in got] == [e.tokens for e in expected]
    assert [g.finish_reason for g in got] == [e.finish_reason for e in expected]


def test_requests_arriving_while_others_decode(service, loaded_tiny_pair, make_requests):
    requests = make_requests(0.0, n=8, seed=9) + make_requests(1.0, n=8, seed=10)
    expected = autoregressive_generate(loaded_tiny_pair.target, requests)
    results, lock, done = {}, threading.Lock(), threading.Event()

    def sink(i):
        def on_event(event):
            if event.finished:
                with lock:
                    results[i] = event.result
                    if len(results) == len(requests):
                        done.set()
        return on_event

    for i, request in enumerate(requests):
        service.submit(request, sink(i))
        time.sleep(0.01 * (i % 3))
    assert done.wait(120)
    assert [results[i].tokens for i in range(len(requests))] == [e.tokens for e in expected]


def test_streamed_tokens_concatenate_to_the_result(service):
    events = []
    finished = threading.Event()
    request = Request((1, 2, 3, 4), SamplingParams(0.7, seed=11), StopCriteria(30))

    def sink(event):
        events.append(event)
        if event.finished:
            finished.set()

    service.submit(request, sink)
    assert finished.wait(60)
    streamed = [t for e in events[:-1] for t in e.tokens]
    assert streamed == events[-1].result.tokens and len(streamed) == 30
    assert events[-1].stats["verify_steps"] >= 1


def test_cancelled_request_frees_its_slot(service):
    cancelled = threading.Event()
    outcome = {}
    gate = threading.Event()

    def sink(event):
        if event.tokens:
            cancelled.set()  # cancel after the first streamed tokens
        if event.finished:
            outcome["event"] = event
            gate.set()

    service.submit(Request((5, 6), stop=StopCriteria(100)), sink, is_cancelled=cancelled.is_set)
    assert gate.wait(60)
    assert outcome["event"].cancelled and outcome["event"].result.finish_reason == "cancelled"
    assert len(outcome["event"].result.tokens) < 100
    deadline = time.time() + 10
    while len(service.scheduler.free_slots) != 4 and time.time() < deadline:
        time.sleep(0.01)
    assert len(service.scheduler.free_slots) == 4


def test_sink_that_raises_cancels_only_its_request(service, loaded_tiny_pair):
    def broken(event):
        raise ConnectionError("client went away")

    service.submit(Request((9, 9, 9), stop=StopCriteria(50)), broken)
    good = Request((3, 1, 4), SamplingParams(0.5, seed=2), StopCriteria(20))
    assert service.generate([good])[0].tokens == autoregressive_generate(loaded_tiny_pair.target, [good])[0].tokens


def test_request_too_long_for_the_bundle_is_rejected(service):
    with pytest.raises(ValueError, match="max_seq_len"):
        service.submit(Request(tuple(range(100)), stop=StopCriteria(100)), lambda e: None)


def test_block_size_one_service_is_plain_autoregressive(loaded_tiny_pair, make_requests):
    svc = DFlashService(loaded_tiny_pair, ServiceLimits(max_batch_size=3, max_seq_len=128, block_size=1))
    try:
        requests = make_requests(0.9, n=5, seed=21)
        got = svc.generate(requests)
        assert [g.tokens for g in got] == [e.tokens for e in autoregressive_generate(loaded_tiny_pair.target, requests)]
        assert all(set(g.acceptance_lengths) <= {1} for g in got)
    finally:
        svc.shutdown()


def test_block_size_schedule_narrows_busy_steps_and_stays_lossless(loaded_tiny_pair, make_requests):
    limits = ServiceLimits(max_batch_size=6, max_seq_len=128, block_size=8, block_size_schedule={3: 4, 5: 2})
    svc = DFlashService(loaded_tiny_pair, limits)
    try:
        assert [svc.scheduler.verify_width(b) for b in (1, 2, 3, 4, 5, 6)] == [8, 8, 4, 4, 2, 2]
        requests = make_requests(0.7, n=9, seed=31)
        got = svc.generate(requests)
        assert [g.tokens for g in got] == [e.tokens for e in autoregressive_generate(loaded_tiny_pair.target, requests)]
    finally:
        svc.shutdown()


def test_schedule_block_1_runs_autoregressive_steps_and_keeps_the_draft_context(shipped_pair):
    """{3: 1}: with 3 requests running, steps verify the bonus token alone (no draft pass); when one
    finishes, drafting resumes from a draft context that the AR steps kept complete — acceptance on
    the shipped pair is then what an unscheduled run gets, and tokens equal autoregressive decoding."""
    from dflash_trt.bench.local import load_prompts

    prompts = load_prompts(None, None, 3)
    requests = [Request(tuple(p), stop=StopCriteria(n)) for p, n in zip(prompts, (12, 96, 96))]
    expected = autoregressive_generate(shipped_pair.target, requests)
    runs = {}
    for schedule in ({}, {3: 1}):
        svc = DFlashService(shipped_pair, ServiceLimits(max_batch_size=3, max_seq_len=256, block_size=16,
                                                        block_size_schedule=schedule))
        try:
            assert svc.scheduler.verify_width(3) == (1 if schedule else 16)
            runs[bool(schedule)] = svc.generate(requests)
            if schedule:
                _assert_draft_context_complete(shipped_pair, svc.scheduler.draft, requests, runs[True])
        finally:
            svc.shutdown()
    for got in runs.values():
        assert [g.tokens for g in got] == [e.tokens for e in expected]
    for row in (1, 2):
        plain, scheduled = runs[False][row].acceptance_lengths, runs[True][row].acceptance_lengths
        assert scheduled[:3] == [1, 1, 1]  # the first steps ran with 3 requests: autoregressive
        drafted = [a for a in scheduled[3:] if a > 1]
        assert drafted and sum(scheduled) == sum(plain) == 95  # the first token comes from the prefill
        # a draft context missing the AR steps' tokens would draft garbage and accept ~nothing
        tail = scheduled[-10:]
        assert sum(tail) / len(tail) >= 0.7 * sum(plain[-10:]) / 10


def _assert_draft_context_complete(pair, runner, requests, results):
    """Every committed position but the last token (the bonus) is context: slot r (admission order) holds
    the K/V of a prefix of them, equal to the drafter's K/V over the target's taps of the whole sequence,
    and the runner's pending contexts (the steps since its last draft pass: stored by the next one) hold
    exactly the rest."""
    import torch

    target, draft, cache = pair.target, pair.draft, runner.cache
    for slot, (request, result) in enumerate(zip(requests, results)):
        pending = sorted(p for slots, _, positions, valid in runner.pending for row, s in enumerate(slots.tolist())
                         if s == slot for p in positions[row][valid[row]].tolist())
        total = len(request.prompt) + len(result.tokens) - 1
        m = pending[0] if pending else total
        assert pending == list(range(m, total)), (slot, m, pending)
        sequence = torch.tensor([list(request.prompt) + result.tokens])
        positions = torch.arange(sequence.shape[1])[None]
        with torch.inference_mode():
            _, taps = target(sequence, positions, target.new_cache(1, sequence.shape[1]), torch.arange(1),
                             draft.config.target_layer_ids)
            ctx = draft.context_features(taps)
            cos, sin = draft.rotary(positions, ctx.dtype)
            for i, layer in enumerate(draft.layers):
                k, v = layer.self_attn.key_value(ctx, cos, sin)  # [1, T, kv_heads, D]
                assert torch.allclose(cache.k[i, slot, :, :m], k[0, :m].transpose(0, 1), atol=1e-4), (slot, i)
                assert torch.allclose(cache.v[i, slot, :, :m], v[0, :m].transpose(0, 1), atol=1e-4), (slot, i)


def test_served_steps_check_their_layers_weights_once(loaded_tiny_pair, monkeypatch, make_requests):
    """Each CPU runner's passes share one `weights_fixed_in` memo: the C++ passes of a served pair check its
    layers' tensors on the first pass only, and the tokens stay the autoregressive ones."""
    from dflash_trt.backends.cpu import layers as cpu_layers

    checks = []
    objects = cpu_layers._objects
    monkeypatch.setattr(cpu_layers, "_objects", lambda layer: checks.append(1) or objects(layer))
    requests = make_requests(0.0, n=3, seed=5)
    svc = DFlashService(loaded_tiny_pair, ServiceLimits(max_batch_size=2, max_seq_len=128))
    try:
        first = svc.generate(requests)
        after_first = len(checks)
        again = svc.generate(requests)
    finally:
        svc.shutdown()
    layers = len(loaded_tiny_pair.target.model.layers) + len(loaded_tiny_pair.draft.layers)
    assert 0 < after_first <= layers  # each layer list checked once, on its first pass
    assert len(checks) == after_first  # later steps reuse the plans
    expected = [e.tokens for e in autoregressive_generate(loaded_tiny_pair.target, requests)]
    assert [g.tokens for g in first] == [g.tokens for g in again] == expected


def test_long_prompts_prefill_a_chunk_per_step_between_decode_steps(shipped_pair):
    """A prompt longer than the runner's prefill_chunk is prefilled one chunk per engine step while the other
    requests decode: a short request admitted with it streams tokens before the long one has its first; the
    tokens are the autoregressive ones, and a request decoding alone accepts what it does unchunked, step for
    step (the drafter's context of each chunk is complete; in a shared batch the drafter's numbers may take
    another path, so there only the tokens must match)."""
    from dflash_trt.bench.local import context_prompts, load_prompts
    from dflash_trt.runtime.local import local_engine

    stream = load_prompts(None, None, None)
    long, short = context_prompts(stream, 150, 2), load_prompts(None, None, 1)[0][:24]  # short: within a chunk
    requests = [Request(tuple(long[0]), stop=StopCriteria(40)), Request(tuple(short), stop=StopCriteria(40)),
                Request(tuple(long[1]), stop=StopCriteria(24))]
    expected = autoregressive_generate(shipped_pair.target, requests)
    runs = {}
    for chunk in (None, 32):
        engine = local_engine(shipped_pair, 256, max_batch_size=3, width_policy="schedule")  # full blocks: widths
        engine.scheduler.prefill_chunk = chunk  # that do not depend on timing or on who shares a step
        order = []
        runs[chunk] = engine.generate(requests, on_commit=lambda i, tokens: order.append(i))
        assert engine.scheduler.idle and not engine.scheduler.prefilling and len(engine.scheduler.free_slots) == 3
        if chunk:
            firsts = [order.index(i) for i in range(3)]
            assert firsts[1] == 0 and order[: firsts[0]].count(1) >= 3  # the short one decoded meanwhile
            assert firsts[2] > firsts[0]  # long prompts take their chunks in admission order
    for got in runs.values():
        assert [g.tokens for g in got] == [e.tokens for e in expected]
    alone = {}
    for chunk in (None, 32):
        engine = local_engine(shipped_pair, 256, max_batch_size=1, width_policy="schedule")
        engine.scheduler.prefill_chunk = chunk
        alone[chunk] = engine.generate(requests[:1])[0]
    assert alone[32].tokens == expected[0].tokens
    assert alone[32].acceptance_lengths == alone[None].acceptance_lengths and sum(alone[32].acceptance_lengths) == 39


def test_a_request_cancelled_while_its_prompt_prefills_frees_its_slot(shipped_pair):
    from dflash_trt.bench.local import context_prompts, load_prompts
    from dflash_trt.runtime.local import local_engine

    engine = local_engine(shipped_pair, 256, max_batch_size=1)
    scheduler = engine.scheduler
    scheduler.prefill_chunk = 16
    events, cancel = [], threading.Event()
    prompt = tuple(context_prompts(load_prompts(None, None, None), 100, 1)[0])
    scheduler.submit(Request(prompt, stop=StopCriteria(8)), events.append, cancel.is_set)
    scheduler.step()
    scheduler.step()
    assert scheduler.prefilling and scheduler.prefilling[0].prefilled == 32 and not scheduler.free_slots
    cancel.set()
    scheduler.step()
    assert scheduler.idle and scheduler.free_slots == [0]
    assert events[-1].finished and events[-1].cancelled and not events[-1].tokens
    request = Request(prompt, stop=StopCriteria(8))
    again = engine.generate([request])  # the slot serves the same prompt afresh
    assert again[0].tokens == autoregressive_generate(shipped_pair.target, [request])[0].tokens
