"""Bad words (TensorRT-LLM's `bad_words`): token sequences the output never contains.

A word of one token is never chosen. A word w of L > 1 tokens bans its last token wherever the
context (prompt + generated tokens) ends with w[:-1] — the rule of TensorRT-LLM's banBadWords,
which compares the last L - 1 tokens of each sequence (prompt included) with the word's prefix.

The ban is part of the sampling rule: at each position the banned logits become -inf before
top-k / top-p and the noise, in AR and speculative decoding alike. A verify row i is masked for
the context prompt + committed + d_1 .. d_i; its token is used only when d_1 .. d_i were all
accepted, i.e. exactly in that context. So the output stays the target's own decoding under the
rule, token for token (tests/test_bad_words.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BadWords = tuple[tuple[int, ...], ...]


def banned_ids(words: BadWords, context: Sequence[int]) -> list[int]:
    """Token ids banned as the next token after `context`."""
    banned = []
    for word in words:
        n = len(word) - 1
        if n == 0 or (len(context) >= n and tuple(context[len(context) - n:]) == word[:-1]):
            banned.append(word[-1])
    return banned


def block_bans(words: BadWords, context: Sequence[int], block: Sequence[int]) -> list[list[int]]:
    """Banned ids for each row of a verify block [bonus, d_1 .. d_K] whose bonus follows `context`:
    row i picks the token after context + block[:i + 1]."""
    longest = max((len(w) for w in words), default=1)
    tail = list(context[max(0, len(context) - longest):])
    return [banned_ids(words, tail + list(block[: i + 1])) for i in range(len(block))]


def mask_banned(logits: torch.Tensor, bans: Sequence[Sequence[Sequence[int]] | None]) -> torch.Tensor:
    """logits [B, W, V] with row b, position i's banned ids (bans[b][i]) at -inf, in place; a row
    whose bans is None is left alone."""
    for b, row in enumerate(bans):
        if row is None:
            continue
        for i, ids in enumerate(row[: logits.shape[1]]):
            if ids:
                logits[b, i, torch.tensor(ids, dtype=torch.int64, device=logits.device)] = float("-inf")
    return logits
