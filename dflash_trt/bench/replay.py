"""`dflash-trt bench --url URL --trace FILE`: multi-turn sessions replayed against a server.

A session's turns run one after another (a turn waits for the one before it, plus its think time); sessions run
side by side, `--concurrency` at a time. Every session is replayed four ways in one run — `dflash` and `dflash_ar`,
each with the prefix cache and without it (the request's `prefix_cache` input) — so DFlash, AR and the cache are
compared on the same server. Per turn: TTFT, latency, tokens, τ and the prompt tokens restored from the cache; per
session: end-to-end latency.

Trace formats (one JSON object per line):
- sessions of OpenAI-style messages: `{"session": ID, "turns": [TURN, ...]}`, a TURN being `{"messages":
  [{"role", "content"}, ...], "max_tokens": N, "think_s": S, "fresh": BOOL}`. A turn's prompt is the session's
  history (every earlier turn's messages and answer) followed by its own messages — or its messages alone when it
  is `fresh` (another agent taking over). `{previous}` in a content is the previous turn's answer (a hand-off).
  A conversation is rendered as its contents, each on its own line, with no chat template: the server sees the same
  text prefix turn after turn, as it would through a template.
- aiperf / mooncake request traces: `{"timestamp": MS, "input_length": N, "output_length": M, "hash_ids": [..]}`,
  one single-turn session per line, started at its timestamp; every hash id is a block of `MOONCAKE_BLOCK` tokens
  (the same id, the same tokens: the trace's shared prefixes), sent as token ids.
`builtin:agents` is the shipped agent workload for the tiny pair (dflash_trt/assets/agent_trace.jsonl).
"""

from __future__ import annotations

import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dflash_trt.checkpoint.json_fields import jsonl_records
from dflash_trt.errors import ConfigError
from dflash_trt.triton.client import grpc_generate, request_inputs

BUILTIN_AGENTS = Path(__file__).resolve().parent.parent / "assets" / "agent_trace.jsonl"
MOONCAKE_BLOCK = 512  # tokens per hash id in mooncake's traces
VARIANTS = (("dflash", True), ("dflash", False), ("dflash_ar", True), ("dflash_ar", False))


@dataclass
class Turn:
    messages: list[str] = field(default_factory=list)  # contents this turn adds
    max_tokens: int = 64
    think_s: float = 0.0
    fresh: bool = False
    input_ids: list[int] | None = None  # a request trace's prompt (token ids), instead of messages
    start_s: float = 0.0  # a request trace's timestamp


@dataclass
class Session:
    name: str
    turns: list[Turn]


def load_trace(path: str) -> list[Session]:
    """Sessions from a trace file (either format; `builtin:agents` for the shipped one)."""
    file = BUILTIN_AGENTS if path == "builtin:agents" else Path(path)
    if not file.is_file():
        raise ConfigError(f"--trace {path}: no such file (or builtin:agents for the shipped agent workload)")
    sessions = []
    for n, record in jsonl_records(file):
        if isinstance(record, dict) and "turns" in record:
            sessions.append(_session(record, f"{file}:{n}"))
        elif isinstance(record, dict) and "hash_ids" in record:
            sessions.append(_request(record, f"{file}:{n}"))
        else:
            raise ConfigError(f"{file}:{n}: expected a session ({{'turns': [...]}}) or a request trace line "
                              "({'hash_ids': [...], 'input_length', 'output_length', 'timestamp'})")
    if not sessions:
        raise ConfigError(f"{file}: no sessions")
    return sessions


def _session(record: dict, where: str) -> Session:
    turns = []
    for i, turn in enumerate(record["turns"]):
        messages = turn.get("messages") if isinstance(turn, dict) else None
        if not (isinstance(messages, list) and all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                                   for m in messages)):
            raise ConfigError(f"{where}: field 'turns[{i}].messages': expected a list of {{'role', 'content'}}")
        turns.append(Turn([m["content"] for m in messages], int(turn.get("max_tokens", 64)),
                          float(turn.get("think_s", 0.0)), bool(turn.get("fresh", False))))
    return Session(str(record.get("session", where)), turns)


def _request(record: dict, where: str) -> Session:
    try:
        n, m, ids = int(record["input_length"]), int(record["output_length"]), [int(h) for h in record["hash_ids"]]
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{where}: expected 'input_length', 'output_length' (ints) and 'hash_ids' (ints)") from None
    tokens = [t for h in ids for t in _block(h)][:n]
    return Session(where, [Turn(max_tokens=max(1, m), input_ids=tokens, start_s=float(record.get("timestamp", 0))
                                / 1000)])


def _block(hash_id: int) -> list[int]:
    """The tokens a hash id stands for: seeded by the id (ids under 256: valid in any vocabulary)."""
    rng = random.Random(hash_id)
    return [rng.randrange(256) for _ in range(MOONCAKE_BLOCK)]


@dataclass
class TurnResult:
    session: str
    turn: int
    ttft_s: float
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    acceptance_lengths: list[int] = field(repr=False)
    answer: list[int] = field(repr=False)


def run_session(url: str, model: str, cache: bool, session: Session, temperature: float, seed: int,
                t_start: float) -> tuple[float, list[TurnResult]]:
    """(end-to-end seconds, per turn) of one session through `model`."""
    history, previous, results = "", "", []
    wait = session.turns[0].start_s - (time.perf_counter() - t_start)
    if wait > 0:
        time.sleep(wait)
    t0 = time.perf_counter()
    for i, turn in enumerate(session.turns):
        if turn.think_s and i:
            time.sleep(turn.think_s)
        own = "".join(c.replace("{previous}", previous) + "\n" for c in turn.messages)
        text = own if turn.fresh or not history else history + own
        inputs = request_inputs(None if turn.input_ids else text, turn.input_ids, turn.max_tokens,
                                temperature=temperature, seed=seed + i, ignore_eos=True, prefix_cache=cache)
        start = time.perf_counter()
        result = grpc_generate(url, inputs, model=model)
        results.append(TurnResult(session.name, i, result.ttft_s, time.perf_counter() - start, result.prompt_tokens,
                                  result.cached_tokens, len(result.token_ids), result.acceptance_lengths,
                                  result.token_ids))
        previous = result.text
        history = text + result.text + "\n"
    return time.perf_counter() - t0, results


@dataclass
class ReplayPoint:
    model: str
    cache: bool
    concurrency: int
    wall_s: float
    session_s: list[float] = field(repr=False)
    turns: list[TurnResult] = field(repr=False)

    @property
    def output_tokens_per_s(self) -> float:
        return sum(t.output_tokens for t in self.turns) / self.wall_s

    @property
    def tau(self) -> float:
        steps = [n for t in self.turns for n in t.acceptance_lengths]
        return sum(steps) / len(steps) if steps else 0.0

    def to_dict(self) -> dict:
        return {"model": self.model, "prefix_cache": self.cache, "concurrency": self.concurrency,
                "wall_s": self.wall_s, "sessions": len(self.session_s),
                "session_mean_s": statistics.fmean(self.session_s), "output_tokens_per_s": self.output_tokens_per_s,
                "ttft_mean_s": statistics.fmean(t.ttft_s for t in self.turns), "tau": self.tau,
                "cached_share": sum(t.cached_tokens for t in self.turns) / max(1, sum(t.prompt_tokens
                                                                                    for t in self.turns)),
                "turns": [asdict(t) | {"answer": None} for t in self.turns]}


def replay(url: str, sessions: list[Session], concurrency: int, temperature: float = 0.0, seed: int = 0,
           progress=None) -> list[ReplayPoint]:
    """Every session four ways (VARIANTS), `concurrency` sessions at a time."""
    points = []
    for model, cache in VARIANTS:
        t_start = time.perf_counter()

        def one(j: int, model=model, cache=cache, t_start=t_start):
            out = run_session(url, model, cache, sessions[j], temperature, seed + 1000 * j, t_start)
            if progress is not None:
                progress()
            return out

        with ThreadPoolExecutor(concurrency) as pool:
            done = list(pool.map(one, range(len(sessions))))
        points.append(ReplayPoint(model, cache, concurrency, time.perf_counter() - t_start, [d[0] for d in done],
                                  [t for d in done for t in d[1]]))
    return points


def summary(points: list[ReplayPoint], warm_share: float = 0.9) -> dict:
    """The comparisons the benchmark is for, at one concurrency: session latency of AR without the cache and of
    DFlash without it over DFlash with it; TTFT of the turns whose prompt was >= `warm_share` restored, warm over
    the same turns cold; τ of DFlash warm over cold; throughput with the cache over without; and whether every
    greedy turn's answer is the same four ways."""
    by = {(p.model, p.cache): p for p in points}
    fast, slow = by["dflash", True], by["dflash", False]
    mean = lambda p: statistics.fmean(p.session_s)  # noqa: E731
    cold = {(t.session, t.turn): t for t in slow.turns}
    warm = [(t, cold[t.session, t.turn]) for t in fast.turns
            if t.prompt_tokens and t.cached_tokens >= warm_share * t.prompt_tokens]
    answers = {(t.session, t.turn): t.answer for t in fast.turns}
    same = all(answers[t.session, t.turn] == t.answer for p in points for t in p.turns)
    return {"concurrency": fast.concurrency,
            "session_speedup_vs_ar_without_cache": mean(by["dflash_ar", False]) / mean(fast),
            "session_speedup_vs_dflash_without_cache": mean(slow) / mean(fast),
            "warm_turns": len(warm),
            "warm_ttft_over_cold": (statistics.fmean(w.ttft_s for w, _ in warm) /
                                    statistics.fmean(c.ttft_s for _, c in warm)) if warm else None,
            "tau_warm_over_cold": fast.tau / slow.tau if slow.tau else None,
            "throughput_with_over_without_cache": fast.output_tokens_per_s / slow.output_tokens_per_s,
            "answers_identical": same}
