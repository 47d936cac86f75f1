"""Continuous batching: requests admitted mid-flight decode exactly their autoregressive tokens."""

import threading
import time

import pytest

from dflash_trt.runtime.service import DFlashService, ServiceLimits
from dflash_trt.spec.autoregressive import autoregressive_generate
from dflash_trt.spec.requests import Request, StopCriteria
from dflash_trt.spec.sampling import SamplingParams
from test_lossless import _requests


@pytest.fixture(scope="module")
def service(loaded_tiny_pair):
    svc = DFlashService(loaded_tiny_pair, ServiceLimits(max_batch_size=4, max_seq_len=128, block_size=4))
    yield svc
    svc.shutdown()


def test_more_requests_than_slots_match_autoregressive(service, loaded_tiny_pair):
    requests = _requests(0.8, n=14, seed=5)
    expected = autoregressive_generate(loaded_tiny_pair.target, requests)
    got = service.generate(requests)
    assert [g.tokens for g in got] == [e.tokens for e in expected]
    assert [g.finish_reason for g in got] == [e.finish_reason for e in expected]


def test_requests_arriving_while_others_decode(service, loaded_tiny_pair):
    requests = _requests(0.0, n=8, seed=9) + _requests(1.0, n=8, seed=10)
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


def test_block_size_one_service_is_plain_autoregressive(loaded_tiny_pair):
    svc = DFlashService(loaded_tiny_pair, ServiceLimits(max_batch_size=3, max_seq_len=128, block_size=1))
    try:
        requests = _requests(0.9, n=5, seed=21)
        got = svc.generate(requests)
        assert [g.tokens for g in got] == [e.tokens for e in autoregressive_generate(loaded_tiny_pair.target, requests)]
        assert all(set(g.acceptance_lengths) <= {1} for g in got)
    finally:
        svc.shutdown()


def test_block_size_schedule_narrows_busy_steps_and_stays_lossless(loaded_tiny_pair):
    limits = ServiceLimits(max_batch_size=6, max_seq_len=128, block_size=8, block_size_schedule={3: 4, 5: 2})
    svc = DFlashService(loaded_tiny_pair, limits)
    try:
        assert [svc.scheduler.verify_width(b) for b in (1, 2, 3, 4, 5, 6)] == [8, 8, 4, 4, 2, 2]
        requests = _requests(0.7, n=9, seed=31)
        got = svc.generate(requests)
        assert [g.tokens for g in got] == [e.tokens for e in autoregressive_generate(loaded_tiny_pair.target, requests)]
    finally:
        svc.shutdown()
