"""Adaptive verify width: how many drafts to verify per step, chosen from measured acceptance.

A step that verifies w tokens (the bonus + K = w-1 drafts) commits on average
1 + p_1 + ... + p_K tokens, where p_i is the probability that draft i is accepted (the
per-position acceptance). On a device where a step costs about `cost_tokens + w` (in units of one
extra verified token; `cost_tokens` is the fixed cost of a step: the draft pass, the weight reads,
launch / op overheads), the committed tokens per unit time are

    (1 + p_1 + ... + p_{w-1}) / (cost_tokens + w),

and the best width maximises it. GPUs verify tens of tokens for about the price of one
(`cost_tokens` in the hundreds: full blocks), a small CPU does not (measured ~28 on the 2-core dev
machine). The choice never changes which tokens are emitted: every committed token is the
target's own (the lossless contract holds at any width).

p_i is an exponential moving average per position; positions beyond the current width get no
evidence, so every `explore_every` steps the full block is verified again.
"""

from __future__ import annotations


class AdaptiveWidth:
    def __init__(self, max_width: int, cost_tokens: float, decay: float = 0.95, explore_every: int = 16):
        if max_width < 2:
            raise ValueError(f"max_width must be >= 2, got {max_width}")
        self.max_width, self.cost_tokens = max_width, float(cost_tokens)
        self.decay, self.explore_every = decay, explore_every
        self.accept = [1.0] * (max_width - 1)  # p_1 .. p_K, optimistic until measured
        self.steps = 0

    def update(self, accepted: list[int], drafts: int) -> None:
        """Fold one step in: `accepted[r]` drafts accepted by row r, `drafts` proposed per row."""
        for i in range(1, drafts + 1):
            share = sum(a >= i for a in accepted) / len(accepted)
            self.accept[i - 1] = self.decay * self.accept[i - 1] + (1 - self.decay) * share
        self.steps += 1

    def expected_tokens(self, width: int) -> float:
        return 1.0 + sum(self.accept[: width - 1])

    def width(self) -> int:
        """The width for the next step (the full block on exploration steps)."""
        if self.explore_every and self.steps % self.explore_every == 0:
            return self.max_width
        return max(range(2, self.max_width + 1),
                   key=lambda w: self.expected_tokens(w) / (self.cost_tokens + w))
