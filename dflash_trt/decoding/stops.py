"""Stop strings without rescanning: incremental detokenization and one automaton for all stop strings.

A request's stop strings end it as soon as its text contains any of them. The text of n tokens is
not re-decoded and rescanned after every token (O(n) each, O(n * stops) to scan):
- `IncrementalText` decodes only a short window of recent tokens per step (the prefix/read offsets of
  TGI and vLLM): the delta is what decoding the window adds past its already-emitted prefix; a delta
  ending in an incomplete UTF-8 sequence (U+FFFD) waits for the next token. For byte-level BPE
  (Qwen3, Llama 3) the deltas concatenate to exactly `detokenize(tokens)`.
- `StopAutomaton` is an Aho–Corasick automaton over every stop string of a request; a `StopScanner`
  walks it one character at a time, so a step costs the length of its new text, whatever the number
  of stop strings. Its state also says how long a tail of the text could still grow into a stop
  string (`pending`), which is how much streamed text must be held back.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable


class StopAutomaton:
    """Aho–Corasick over `stop_strings`: state 0 is the root; `goto[s][c]` the trie edges; `fail[s]`
    the longest proper suffix state; `ends[s]` the lengths of the stop strings ending at s (its own
    and those of its fail chain, longest first); `depth[s]` the length of the prefix s spells."""

    def __init__(self, stop_strings: tuple[str, ...]):
        self.goto: list[dict[str, int]] = [{}]
        self.depth, self.fail, ends = [0], [0], [[]]
        for stop in stop_strings:
            state = 0
            for ch in stop:
                nxt = self.goto[state].get(ch)
                if nxt is None:
                    nxt = len(self.goto)
                    self.goto[state][ch] = nxt
                    self.goto.append({})
                    self.depth.append(self.depth[state] + 1)
                    self.fail.append(0)
                    ends.append([])
                state = nxt
            ends[state].append(len(stop))
        queue = deque(self.goto[0].values())
        while queue:  # breadth first: a state's fail link is set before its children's
            state = queue.popleft()
            for ch, child in self.goto[state].items():
                queue.append(child)
                if state:  # depth-1 states fail to the root
                    back = self.fail[state]
                    while back and ch not in self.goto[back]:
                        back = self.fail[back]
                    self.fail[child] = self.goto[back].get(ch, 0)
                ends[child] = sorted(set(ends[child] + ends[self.fail[child]]), reverse=True)
        self.ends = [tuple(e) for e in ends]

    def step(self, state: int, ch: str) -> int:
        while state and ch not in self.goto[state]:
            state = self.fail[state]
        return self.goto[state].get(ch, 0)


class StopScanner:
    """Feeds text to a `StopAutomaton`; remembers where the earliest stop string starts."""

    def __init__(self, automaton: StopAutomaton):
        self.automaton, self.state, self.offset = automaton, 0, 0
        self.first_stop: int | None = None  # character offset of the earliest stop string found

    def feed(self, text: str) -> int | None:
        """Scan `text` (the next characters); returns the offset of the earliest stop string seen so
        far (all stop strings ending inside `text` count), or None."""
        automaton, state, start = self.automaton, self.state, self.offset
        for i, ch in enumerate(text):
            state = automaton.step(state, ch)
            ends = automaton.ends[state]
            if ends:
                begin = start + i + 1 - ends[0]  # the longest one ending here starts earliest
                if self.first_stop is None or begin < self.first_stop:
                    self.first_stop = begin
        self.state, self.offset = state, start + len(text)
        return self.first_stop

    @property
    def pending(self) -> int:
        """Length of the longest tail of the text so far that is a proper prefix of a stop string."""
        return self.automaton.depth[self.state] if not self.automaton.ends[self.state] else 0


class IncrementalText:
    """`detokenize(tokens)` built up delta by delta, decoding a window of recent tokens per push."""

    def __init__(self, detokenize: Callable[[list[int]], str]):
        self.detokenize = detokenize
        self.tokens: list[int] = []
        self.text = ""  # the emitted text so far
        self.prefix = self.read = 0  # window: tokens[prefix:read] produced the last delta's context

    def push(self, new: list[int]) -> str:
        """Append tokens; returns the text they complete ("" while it ends mid UTF-8 sequence)."""
        self.tokens.extend(new)
        before = self.detokenize(self.tokens[self.prefix : self.read])
        window = self.detokenize(self.tokens[self.prefix :])
        if len(window) <= len(before) or window.endswith("\ufffd"):
            return ""
        delta = window[len(before) :]
        self.prefix, self.read = self.read, len(self.tokens)
        self.text += delta
        return delta
