"""Requests, per-row decoding state and results shared by the speculative and AR loops.

Stop rules (identical in every loop, so outputs compare token for token):
- EOS / stop token ids: the stop token is kept in `tokens`; nothing after it.
- stop strings: `tokens` end with the token that completes the first stop string; the returned
  `text` is cut just before the stop string (OpenAI semantics).
- max_new_tokens: at most this many tokens.
Tokens that follow a stop inside an accepted block are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dflash_trt.decoding.bad_words import banned_ids, block_bans
from dflash_trt.decoding.sampling import SamplingParams
from dflash_trt.decoding.stops import IncrementalText, StopAutomaton, StopScanner

Detokenize = Callable[[list[int]], str]
OnCommit = Callable[[int, list[int]], None]  # (row index, newly committed tokens)


@dataclass(frozen=True)
class StopCriteria:
    max_new_tokens: int = 64
    stop_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not s for s in self.stop_strings):
            raise ValueError("stop strings must be non-empty")


@dataclass(frozen=True)
class Request:
    prompt: tuple[int, ...]
    params: SamplingParams = SamplingParams()
    stop: StopCriteria = StopCriteria()
    bad_words: tuple[tuple[int, ...], ...] = ()  # token sequences never generated (decoding/bad_words.py)
    prefix_cache: bool = True  # False: neither restores a cached prefix nor leaves its blocks cached

    def __post_init__(self):
        if not self.prompt:
            raise ValueError("prompt must contain at least one token")
        if any(not w for w in self.bad_words):
            raise ValueError("bad words must be non-empty token sequences")

    def bans(self, generated: list[int], block: list[int] | None = None) -> list[list[int]] | None:
        """Banned ids for the next token after prompt + generated (block: for each row of a verify block
        [bonus, d_1 ..] that follows them; the bonus is generated[-1]); None without bad words."""
        if not self.bad_words:
            return None
        context = self.prompt + tuple(generated)
        if block is None:
            return [banned_ids(self.bad_words, context)]
        return block_bans(self.bad_words, context[:-1], block)


@dataclass
class GenerationResult:
    tokens: list[int]  # generated tokens, prompt excluded
    finish_reason: str  # "stop" | "length"
    acceptance_lengths: list[int] = field(default_factory=list)  # tokens committed per verify step
    accepted_drafts: list[int] = field(default_factory=list)  # drafts accepted per verify step (a)
    text: str | None = None
    draft_tokens: int = 0  # drafts proposed over all verify steps (TensorRT-LLM's total_draft_tokens)
    cached_tokens: int = 0  # prompt tokens restored from the prefix cache instead of prefilled


class Row:
    """One request being decoded: its committed tokens and stop bookkeeping."""

    def __init__(self, index: int, request: Request, detokenize: Detokenize | None):
        self.index, self.request, self.detokenize = index, request, detokenize
        self.tokens: list[int] = []
        self.finish_reason: str | None = None
        self.acceptance_lengths: list[int] = []
        self.accepted_drafts: list[int] = []
        self.draft_tokens = 0
        self.cached_tokens = 0
        self.stop_text: tuple[IncrementalText, StopScanner] | None = None
        if request.stop.stop_strings:
            if detokenize is None:
                raise ValueError("stop strings need a tokenizer to detokenize")
            self.stop_text = (IncrementalText(detokenize), StopScanner(StopAutomaton(request.stop.stop_strings)))

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        """Tokens this row may still commit (a verify of more rows than this commits no more)."""
        return self.request.stop.max_new_tokens - len(self.tokens)

    def commit(self, new: list[int], on_commit: OnCommit | None = None) -> int:
        """Append target-chosen tokens up to the first stop; returns how many were kept."""
        stop = self.request.stop
        kept = 0
        for token in new:
            self.tokens.append(token)
            kept += 1
            if token in stop.stop_token_ids or self._hit_stop_string(token):
                self.finish_reason = "stop"
            elif len(self.tokens) >= stop.max_new_tokens:
                self.finish_reason = "length"
            if self.done:
                break
        if on_commit is not None and kept:
            on_commit(self.index, self.tokens[-kept:])
        return kept

    def _hit_stop_string(self, token: int) -> bool:
        """Whether the text now contains a stop string (only the new text is decoded and scanned)."""
        if self.stop_text is None:
            return False
        text, scanner = self.stop_text
        return scanner.feed(text.push([token])) is not None

    def result(self) -> GenerationResult:
        text = None
        if self.detokenize is not None:
            text = cut_at_stop_string(self.detokenize(self.tokens), self.request.stop.stop_strings)
        return GenerationResult(
            list(self.tokens), self.finish_reason or "length",
            self.acceptance_lengths, self.accepted_drafts, text, self.draft_tokens, self.cached_tokens,
        )


def cut_at_stop_string(text: str, stop_strings: tuple[str, ...]) -> str:
    """Text before the earliest stop string (unchanged when none occurs)."""
    cuts = [text.find(s) for s in stop_strings if s in text]
    return text[: min(cuts)] if cuts else text
