"""Incremental detokenization for streaming: text deltas that never need to be taken back.

A delta is withheld while the text ends in an incomplete UTF-8 sequence or while its tail could still
grow into a stop string; at the end the text is cut before the first stop string. Each push decodes
only a window of recent tokens and scans only the new characters (decoding/stops.py), so a long
answer or thousands of stop strings cost the same per token as a short one.
"""

from __future__ import annotations

from dflash_trt.decoding.requests import cut_at_stop_string
from dflash_trt.decoding.stops import IncrementalText, StopAutomaton, StopScanner


class TextStream:
    def __init__(self, detokenize, stop_strings: tuple[str, ...] = ()):
        self.detokenize, self.stop_strings = detokenize, stop_strings
        self.text = IncrementalText(detokenize)
        self.scanner = StopScanner(StopAutomaton(stop_strings))
        self.sent = 0  # characters already emitted

    def push(self, tokens: list[int]) -> str:
        """Add committed tokens; return the new text that is safe to emit now."""
        stop = self.scanner.feed(self.text.push(tokens))
        safe = stop if stop is not None else len(self.text.text) - self.scanner.pending
        return self._emit(self.text.text, safe)

    def finish(self) -> str:
        """All remaining text (cut before any stop string)."""
        text = cut_at_stop_string(self.detokenize(self.text.tokens), self.stop_strings)
        return self._emit(text, len(text))

    def full(self, tokens: list[int]) -> str:
        """The whole text of `tokens`, cut before the first stop string (non-streaming responses)."""
        return cut_at_stop_string(self.detokenize(tokens), self.stop_strings)

    def _emit(self, text: str, upto: int) -> str:
        if upto <= self.sent:
            return ""
        delta = text[self.sent : upto]
        self.sent = upto
        return delta
