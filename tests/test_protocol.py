"""Request parsing and streamed-text rules of the `dflash` Triton model (no server needed)."""

import numpy as np
import pytest

from dflash_trt.errors import RequestError
from dflash_trt.triton.protocol import parse_request
from dflash_trt.triton.text_stream import TextStream


def _get(**inputs):
    def get(name):
        if name not in inputs:
            return None
        value = inputs[name]
        return np.array(value if isinstance(value, list) else [value], dtype=object if isinstance(value, (bytes, str)) or (
            isinstance(value, list) and value and isinstance(value[0], (bytes, str))) else None)
    return get


class CharTokenizer:
    """One token per character (ids = code points), enough to test text handling."""

    eos_token_id = 0
    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i)


def test_defaults_and_eos():
    parsed = parse_request(_get(input_ids=[5, 6, 7]), None, 100, 256, frozenset({0}))
    assert parsed.request.prompt == (5, 6, 7) and parsed.stream is False
    assert parsed.request.stop.max_new_tokens == 64 and parsed.request.stop.stop_token_ids == {0}
    assert parsed.request.params.temperature == 0.0


def test_text_prompt_with_sampling_and_stop_words():
    parsed = parse_request(_get(text_input=b"hi", max_tokens=5, temperature=0.5, top_k=3, top_p=0.9,
                                seed=2**64 - 1, stop_words=[b"x", b""], stream=True), CharTokenizer(), 100, 1000)
    r = parsed.request
    assert r.prompt == (104, 105) and parsed.stream
    assert (r.params.temperature, r.params.top_k, r.params.top_p, r.params.seed) == (0.5, 3, pytest.approx(0.9), 2**64 - 1)
    assert r.stop.stop_strings == ("x",)


@pytest.mark.parametrize("inputs,fragment", [
    (dict(), "'text_input' (or 'input_ids') is required"),
    (dict(text_input=b""), "prompt is empty"),
    (dict(text_input=b"\xc3\x28"), "not valid UTF-8"),
    (dict(text_input=[b"a", b"b"]), "expected one string"),
    (dict(input_ids=[1, 300]), "outside the vocabulary"),
    (dict(input_ids=list(range(1, 101))), "at most 99"),
    (dict(input_ids=[1], max_tokens=0), "must be >= 1"),
    (dict(input_ids=[1, 2], max_tokens=99), "ask for at most 98"),
    (dict(input_ids=[1], temperature=-1.0), "'temperature': must be >= 0"),
    (dict(input_ids=[1], temperature=float("nan")), "finite number"),
    (dict(input_ids=[1], top_p=0.0), "'top_p': must be in (0, 1]"),
    (dict(input_ids=[1], top_k=-5), "'top_k': must be >= 0"),
    (dict(input_ids=[1], max_tokens=[1, 2]), "expected one value"),
])
def test_bad_requests_are_named(inputs, fragment):
    with pytest.raises(RequestError) as err:
        parse_request(_get(**inputs), CharTokenizer(), 100, 256)
    assert fragment in err.value.format_message()


def test_stream_holds_back_possible_stop_prefix_and_cuts_at_stop():
    stream = TextStream(CharTokenizer().decode, ("END",))
    out = [stream.push([ord(c)]) for c in "abcE"] + [stream.push([ord("N")]), stream.push([ord("x")])]
    assert "".join(out) == "abcENx"  # "EN" then "x": no stop string yet, everything released
    stream = TextStream(CharTokenizer().decode, ("END",))
    pieces = [stream.push([ord(c)]) for c in "abEND"] + [stream.finish()]
    assert pieces[:3] == ["a", "b", ""] and "".join(pieces) == "ab"


def test_stream_waits_for_complete_utf8():
    table = {1: b"\xe2", 2: b"\x82", 3: b"\xac"}  # the euro sign, byte by byte
    decode = lambda ids: b"".join(table[i] for i in ids).decode("utf-8", errors="replace")  # noqa: E731
    stream = TextStream(decode)
    assert [stream.push([1]), stream.push([2]), stream.push([3])] == ["", "", "€"]


class NoEncode(CharTokenizer):
    def encode(self, text, add_special_tokens=True):
        raise AssertionError("tokenized a prompt the byte bound refuses")


def test_a_huge_prompt_is_refused_before_it_is_tokenized():
    from dflash_trt.triton.protocol import RequestLimits

    limits = RequestLimits(max_prompt_bytes=400)
    with pytest.raises(RequestError, match="10000000 bytes is more than 99 tokens"):
        parse_request(_get(text_input=b"a" * 10_000_000), NoEncode(), 100, 256, limits=limits)
    assert parse_request(_get(text_input=b"a" * 30), CharTokenizer(), 100, 256, limits=limits).request.prompt


@pytest.mark.parametrize("inputs,fragment", [
    (dict(stop_words=[b"x"] * 65), "65 stop words; at most 64"),
    (dict(stop_words=[b"x" * 513]), "a stop word of 513 bytes; at most 512"),
    (dict(stop_token_ids=list(range(1025))), "1025 ids; at most 1024"),
])
def test_stop_lists_are_bounded(inputs, fragment):
    with pytest.raises(RequestError, match=fragment):
        parse_request(_get(text_input=b"a", **inputs), NoEncode(), 100, 256)


def test_the_byte_bound_of_the_shipped_tokenizer_holds_for_any_tokens():
    """No sequence of n tokens decodes to more than n x the longest token's bytes."""
    import random
    from pathlib import Path

    from dflash_trt.tokenizer import load_tokenizer
    from dflash_trt.triton.protocol import RequestLimits

    tokenizer = load_tokenizer(Path(__file__).resolve().parents[1] / "dflash_trt" / "assets" / "tiny-qwen3")
    limit = RequestLimits.for_tokenizer(tokenizer, 101).max_prompt_bytes
    per_token, rng, vocab = limit // 100, random.Random(0), len(tokenizer.get_vocab())
    for n in (1, 7, 100):
        for _ in range(50):
            ids = [rng.randrange(vocab) for _ in range(n)]
            assert len(tokenizer.decode(ids).encode("utf-8")) <= n * per_token


def test_a_greedy_only_bundle_refuses_sampled_requests():
    from dflash_trt.triton.protocol import RequestLimits

    greedy = RequestLimits(sampled_requests=False)
    with pytest.raises(RequestError, match="greedy requests only.*runtime.sampled_requests: true"):
        parse_request(_get(input_ids=[5, 6], temperature=0.7), None, 100, 256, limits=greedy)
    assert parse_request(_get(input_ids=[5, 6], temperature=0.0), None, 100, 256, limits=greedy).request.prompt
    assert parse_request(_get(input_ids=[5, 6], temperature=0.7), None, 100, 256).request.params.temperature > 0


def test_messages_go_through_the_chat_template_and_are_checked():
    import json

    from dflash_trt.engine.config import ASSETS
    from dflash_trt.tokenizer import load_tokenizer

    tok = load_tokenizer(ASSETS / "tiny-qwen3")
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def f():"}]
    parsed = parse_request(_get(messages=json.dumps(chat)), tok, 200, 4096)
    want = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
    assert list(parsed.request.prompt) == list(want["input_ids"] if hasattr(want, "keys") else want)
    for bad, fragment in ((json.dumps([{"role": "robot", "content": "x"}]), "message 0 must be"),
                          ("[1, 2", "not JSON"), (json.dumps([]), "non-empty list")):
        with pytest.raises(RequestError, match=fragment):
            parse_request(_get(messages=bad), tok, 200, 4096)
    with pytest.raises(RequestError, match="either messages, text_input or input_ids"):
        parse_request(_get(messages=json.dumps(chat), text_input="x"), tok, 200, 4096)
    with pytest.raises(RequestError, match="no tokenizer"):
        parse_request(_get(messages=json.dumps(chat)), None, 200, 4096)
