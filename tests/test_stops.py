"""Stop strings without rescanning (decoding/stops.py): the automaton equals a brute-force scan, the
incremental text equals a whole decode, and the work per token does not grow with the text or the
number of stop strings."""

import random
from pathlib import Path

import pytest

from dflash_trt.decoding.requests import Request, Row, StopCriteria
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.decoding.stops import IncrementalText, StopAutomaton, StopScanner
from dflash_trt.tokenizer import load_tokenizer
from dflash_trt.triton.text_stream import TextStream

ASSETS = Path(__file__).resolve().parents[1] / "dflash_trt" / "assets"


def _pending(text: str, stops) -> int:
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                best = max(best, k)
                break
    return best


@pytest.mark.parametrize("seed", range(6))
def test_scanner_equals_brute_force(seed):
    rng = random.Random(seed)
    for _ in range(400):
        alphabet = "ab c\u00e9"[: rng.randint(1, 5)]
        stops = tuple(dict.fromkeys("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 5)))
                                    for _ in range(rng.randint(1, 6))))
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        scanner, pos = StopScanner(StopAutomaton(stops)), 0
        while pos < len(text):
            pos += rng.randint(1, 4)
            found, seen = scanner.feed(text[scanner.offset : pos]), text[:pos]
            if any(s in seen for s in stops):  # the chunk that completes the first one
                assert found == min(seen.find(s) for s in stops if s in seen), (stops, seen)
                break
            assert found is None and scanner.pending == _pending(seen, stops), (stops, seen)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(ASSETS / "tiny-qwen3")


def test_incremental_text_equals_the_whole_decode(tokenizer):
    """Random ids of the shipped byte-level BPE (partial UTF-8 bytes and special tokens included)."""
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    rng = random.Random(0)
    vocab = len(tokenizer.get_vocab())
    for _ in range(200):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 60))]
        text, i = IncrementalText(decode), 0
        while i < len(ids):
            n = rng.randint(1, 4)
            text.push(ids[i : i + n])
            i += n
        whole = decode(ids)  # all of it emitted, but for a tail held back while it ends mid UTF-8 sequence
        assert whole.startswith(text.text), (ids, text.text)
        assert whole == text.text or whole.endswith("\ufffd"), (ids, text.text)


def test_row_stops_where_a_whole_decode_first_contains_a_stop_string(tokenizer):
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    ids = tokenizer.encode("def parse(self, argv):\n    return self.parser.parse_args(argv)\n", add_special_tokens=False)
    full = decode(ids)
    for stop in ("parse", "):\n", "argv)", "self.p", "\n", "zzz"):
        row = Row(0, Request(tuple(ids[:2]), SamplingParams(), StopCriteria(1000, frozenset(), (stop,))), decode)
        row.commit(ids)
        want = next((n for n in range(1, len(ids) + 1) if stop in decode(ids[:n])), len(ids))
        assert row.tokens == ids[:want] and (row.finish_reason == "stop") == (stop in full), stop


class CountingDecode:
    """One character per token; counts the characters every decode call produces."""

    def __init__(self):
        self.chars = 0

    def __call__(self, ids):
        self.chars += len(ids)
        return "".join(chr(97 + i % 26) for i in ids)


@pytest.mark.slow
def test_work_per_token_does_not_grow_with_text_or_stop_strings():
    """2,000 tokens against 2,000 stop strings of 200 characters: each token decodes a window of a
    couple of tokens and scans its one new character, not the whole text times the stop strings."""
    rng = random.Random(1)
    stops = tuple("".join(rng.choice("xyz") for _ in range(200)) for _ in range(2000))  # never in the text
    decode = CountingDecode()
    stream = TextStream(decode, stops)
    row = Row(0, Request((1,), SamplingParams(), StopCriteria(10_000, frozenset(), stops)), decode)
    tokens = list(range(2000))
    out = []
    for token in tokens:
        out.append(stream.push([token]))
        row.commit([token])
    assert "".join(out) + stream.finish() == decode(tokens) and row.finish_reason is None
    assert decode.chars < 10 * len(tokens) + 2 * len(tokens)  # windows, plus one whole decode in finish
