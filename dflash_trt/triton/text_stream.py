"""Incremental detokenization for streaming: text deltas that never need to be taken back.

A delta is withheld while the text ends in an incomplete UTF-8 sequence (U+FFFD) or while its
tail could still grow into a stop string; at the end the text is cut before the first stop string.
"""

from __future__ import annotations

from dflash_trt.decoding.requests import cut_at_stop_string


class TextStream:
    def __init__(self, detokenize, stop_strings: tuple[str, ...] = ()):
        self.detokenize, self.stop_strings = detokenize, stop_strings
        self.tokens: list[int] = []
        self.sent = 0  # characters already emitted

    def push(self, tokens: list[int]) -> str:
        """Add committed tokens; return the new text that is safe to emit now."""
        self.tokens.extend(tokens)
        text = cut_at_stop_string(self.detokenize(self.tokens), self.stop_strings)
        safe = len(text)
        if text.endswith("\ufffd"):
            safe = len(text.rstrip("\ufffd"))
        safe = min(safe, len(text) - self._stop_prefix_len(text))
        return self._emit(text, safe)

    def finish(self) -> str:
        """All remaining text (cut before any stop string)."""
        text = cut_at_stop_string(self.detokenize(self.tokens), self.stop_strings)
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

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string."""
        best = 0
        for stop in self.stop_strings:
            for n in range(min(len(stop) - 1, len(text)), 0, -1):
                if text.endswith(stop[:n]):
                    best = max(best, n)
                    break
        return best
