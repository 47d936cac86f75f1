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


# ---------------------------------------------------------------------------------------------
# Measured widths: acceptance per temperature band, pass costs by rows, down to plain AR steps
# ---------------------------------------------------------------------------------------------

# "schedule": block_size_schedule (or the full block); "measured": MeasuredWidth for every batch; "auto"
# (the default): MeasuredWidth once a row samples; all-greedy steps take the schedule if one is set, else
# the full block for one request and MeasuredWidth for several (runtime/scheduler.py `greedy_width`)
WIDTH_POLICIES = ("schedule", "measured", "auto")

TEMPERATURE_BANDS = (0.0, 0.5, 1.0)  # band 0: greedy; 1: (0, 0.5]; 2: (0.5, 1.0]; 3: above 1.0


def temperature_band(temperature: float) -> int:
    """Acceptance is measured per band: a sampled request accepts far fewer drafts than a greedy one."""
    if temperature <= 0.0:
        return 0
    return 1 + sum(temperature > b for b in TEMPERATURE_BANDS[1:])


class MeasuredWidth:
    """The verify width of each step from what this machine measured, arm by arm.

    The arms are widths 1 (a plain autoregressive step: no draft pass; the committed context is stored
    with the next draft pass), 2, 4, 8, ... and the full block. Measured directly, so whatever else shapes
    a step (the confidence cut, the draft vocabulary, sampling costs) is in the numbers:

        position[band, i] the share of rows whose first i drafts were accepted (decayed counts), from every
                          step that verified past draft i, whatever its width: a wide step informs every
                          narrower arm, so a rarely run arm is not judged on a handful of its own steps
        own[band, w]      committed tokens per row per step of arm w itself (decayed mean and weight)
        seconds[B, w, s]  seconds of a step of B rows (draft + verify pass and the commit; s: some row samples,
                          whose draft and verify passes cost more than greedy ones) over its last `window`
                          steps: for AR steps (one row a request) the median (a shared machine's stalls, and
                          a lone AR step among draft steps at ~2x, are outliers, not the cost); for draft
                          steps, which verify 1..w rows as the confidence cut and acceptance go, the mean
                          of those within twice the median (at T 1.0 a width-4 step's median is 13% under
                          its mean)

    An arm's expected tokens per row are 1 + sum_{i<w} position[band, i] (the pooled estimate), moved
    towards its own mean as its own steps accumulate: `prior` own steps weigh as much as the pooled
    estimate. A narrow draft block drafts a little differently from the first positions of a wide one
    (on the shipped pair a width-2 step's first draft is accepted 0.75 of the time at T 0 against 0.66
    in full blocks, 0.38 against 0.35 at T 0.7), which the arm's own steps correct once it runs.

    For a batch whose rows are in bands b_r it picks  w* = argmax_w  sum_r tokens[b_r, w] / seconds[B, w],
    keeping the arm in use unless another measures `margin` better (timings are noisy), so a width
    measuring slower than AR (w = 1) is not kept: DFlash does not lose to autoregressive decoding by its
    own measurements, at any temperature or batch size. An arm not yet measured for this batch (or a band
    of it) runs first, widest first. After that the other arms are explored, at most one step in
    `explore_every`, each arm when it is due: `explore_every / r**6` steps after it last ran (at most
    `max_wait` x explore_every), r = its value / the best's. An arm measuring nearly as good is rechecked
    every few dozen steps, one at 60% of the best's value every few hundred: exploring costs what the
    arm loses to the best, so hopeless arms (a sampled draft pass costs about an AR step on a small CPU)
    are rarely paid for, while drift (acceptance changes with the text, the machine with its load) is still
    found. Lossless at any width: which tokens are committed never depends on it.
    """

    def __init__(self, max_width: int, decay: float = 0.99, explore_every: int = 12, margin: float = 0.05,
                 window: int = 7, max_wait: int = 50, greedy=None, position_decay: float = 0.995, prior: float = 16.0,
                 explore_share: float = 0.03, ar_window: int = 31):
        if max_width < 2:
            raise ValueError(f"max_width must be >= 2, got {max_width}")
        self.max_width, self.decay, self.explore_every = max_width, decay, explore_every
        self.position_decay, self.prior = position_decay, prior
        self.arms = sorted({1, max_width, *(1 << i for i in range(1, max_width.bit_length()) if 1 << i < max_width)})
        self.position: dict[tuple[int, int], list[float]] = {}  # (band, i) -> [rows accepting draft i, rows]
        self.own: dict[tuple[int, int], list[float]] = {}  # (band, arm) -> [tokens per row, steps], decayed
        self.seconds: dict[tuple[int, int, bool], float] = {}
        self.recent: dict[tuple[int, int, bool], list[float]] = {}  # the last `window` step seconds per cost key
        self.held: dict[tuple, int] = {}  # batch composition -> index of the arm in use
        self.last_run: dict[tuple, int] = {}  # (batch composition, width) -> step it last ran
        self.last_explored: dict[tuple, int] = {}  # batch composition -> step of its last exploration
        self.margin, self.window, self.max_wait = margin, window, max_wait
        # AR steps are most of the steps where drafting loses, and they come in bursts: a batch's first AR steps
        # after admitting requests run ~2x (4.4-5.3 ms against 2.2-2.4 at 4 rows, a dozen steps at a time): the
        # median of the last `window` = 7 then read 4.2 ms and held width 2 (0.78x of AR) for the rest of a run
        self.ar_window = ar_window
        # `greedy(batch) -> width or None` (the "auto" policy): all-greedy batches take its width (a fixed
        # schedule: greedy acceptance is high and steady, and the measured choice between near-equal wide arms
        # is noisy) unless it returns None; a batch with any sampled row takes the measured choice
        self.greedy = greedy
        self.probe: tuple | None = None  # (batch composition, width): run once more, its last step was not timed
        # exploring spends at most `explore_share` of the time on what explorations lose to the best arm: `budget`
        # (seconds) grows by that share of every step and pays each exploration's loss; `exploring` is the best
        # arm's value (tokens / s) while an exploration (or its timing probe) runs
        self.explore_share, self.budget, self.exploring, self.explored_best = explore_share, 0.0, None, None
        # expected_tokens per (band, width), kept until a draft step updates what they are computed from: a run of
        # AR steps asks the policy every step (~50 us of ~4 ms, ~40% of it these sums) and changes none of them
        self._tokens: dict[tuple[int, int], float | None] = {}
        self.steps = 0

    @staticmethod
    def _fold(table: dict, key, value: float, weight: float, decay: float) -> None:
        """Decayed sums: a mean over all samples at first, then over about the last 1 / (1 - decay)."""
        sums = table.setdefault(key, [0.0, 0.0])
        sums[0] = decay * sums[0] + value
        sums[1] = decay * sums[1] + weight

    def expected_tokens(self, band: int, width: int) -> float | None:
        """Committed tokens per row of a step at `width` for a row in `band`, None before any step verified
        every draft position below `width` (and none ran this arm)."""
        if width == 1:
            return 1.0
        if (band, width) not in self._tokens:
            self._tokens[band, width] = self._expected_tokens(band, width)
        return self._tokens[band, width]

    def _expected_tokens(self, band: int, width: int) -> float | None:
        pooled = [self.position.get((band, i)) for i in range(1, width)]
        estimate = None if None in pooled else 1.0 + sum(accepted / rows for accepted, rows in pooled)
        own = self.own.get((band, width))
        if own is None:
            return estimate
        if estimate is None:
            return own[0] / own[1]
        return (own[0] + self.prior * estimate) / (own[1] + self.prior)

    @staticmethod
    def cost_key(bands: list[int], width: int) -> tuple[int, int, bool]:
        """What a step's seconds are measured by: rows, width, and whether some row samples."""
        return len(bands), width, any(bands)

    def _time(self, key: tuple[int, int, bool], seconds: float) -> None:
        recent = self.recent.setdefault(key, [])
        recent.append(seconds)
        del recent[: -(self.ar_window if key[1] == 1 else self.window)]
        middle = sorted(recent)[(len(recent) - 1) // 2]  # the lower middle: a stall only ever adds time
        if key[1] == 1:  # an AR step runs one row a request: one mode, and its outliers (a single AR step among
            self.seconds[key] = middle  # draft steps takes ~2x on this CPU) are not its cost
            return
        kept = [s for s in recent if s <= 2 * middle]  # a draft step verifies 1..w rows (the confidence cut): the
        self.seconds[key] = sum(kept) / len(kept)  # mean, but not a stall's

    def value(self, bands: list[int], width: int) -> float | None:
        """Expected committed tokens per second of a step at `width`, or None if not measured yet (nor
        estimable: `estimated_seconds`)."""
        key = self.cost_key(bands, width)
        seconds = self.seconds.get(key)
        if seconds is None:
            seconds = self.estimated_seconds(key)
        tokens = [self.expected_tokens(b, width) for b in bands]
        if seconds is None or None in tokens:
            return None
        return sum(tokens) / max(seconds, 1e-9)

    def estimated_seconds(self, key: tuple[int, int, bool]) -> float | None:
        """A step's seconds at a row count not yet timed at this width, from the nearest row count timed both
        ways: the larger of its cost relative to an AR step there times this row count's AR step, and this
        row count's AR step plus the extra seconds there per row times these rows (a draft step's extra
        verify rows and draft pass grow with the rows, an AR step's one shared weight stream does not: from
        one row, the ratio alone priced a 4-row width-4 step at ~1.4 AR steps where it costs ~2). A
        server's batch size wanders (requests come and go) and timing every arm at every size first would
        run each hopeless wide arm once per size; estimated, an arm is timed when exploration finds it close."""
        rows, width, sampled = key
        ar = self.seconds.get((rows, 1, sampled))
        if width == 1 or ar is None:
            return None
        known = [n for (n, w, s) in self.seconds if w == width and s == sampled and (n, 1, s) in self.seconds]
        if not known:
            return None
        near = min(known, key=lambda n: (abs(n - rows), n))
        there, there_ar = self.seconds[near, width, sampled], self.seconds[near, 1, sampled]
        return max(there / there_ar * ar, ar + max(there - there_ar, 0.0) * rows / near)

    def width(self, bands: list[int]) -> int:
        if not bands:
            return self.max_width
        if self.greedy is not None and not any(bands) and (fixed := self.greedy(len(bands))) is not None:
            return fixed
        if self.probe is not None:
            probe, self.probe = self.probe, None
            if probe[0] == tuple(sorted(bands)):
                self.exploring = self.explored_best
                return probe[1]
        values = [self.value(bands, w) for w in self.arms]
        unmeasured = [w for w, v in zip(self.arms, values) if v is None]
        rows, sampled = len(bands), any(bands)
        if unmeasured:  # widest first; an AR step first where other row counts' timings estimate the rest
            if 1 in unmeasured and any(n != rows and s == sampled for (n, w, s) in self.seconds):
                return 1
            return unmeasured[-1]
        key = tuple(sorted(bands))
        for w in self.arms:  # an estimated arm counts as run now: explored when due, not at once
            if (rows, w, sampled) not in self.seconds:
                self.last_run.setdefault((key, w), self.steps)
        best = max(range(len(self.arms)), key=values.__getitem__)
        held = self.held.get(key)  # hysteresis: keep the arm in use unless beaten by `margin`
        if held is not None and values[held] * (1 + self.margin) >= values[best]:
            best = held
        self.held[key] = best
        if (self.explore_every and self.budget >= 0
                and self.steps - self.last_explored.get(key, -self.explore_every) >= self.explore_every):
            due = self._due(key, values, best)
            if due is not None:
                self.last_explored[key] = self.steps
                self.exploring = self.explored_best = values[best]
                return self.arms[due]
        return self.arms[best]

    def _due(self, key: tuple, values: list[float], best: int) -> int | None:
        """The most overdue arm other than `best`, or None when none is due."""
        top, found, most = max(values[best], 1e-12), None, 1.0
        for i, w in enumerate(self.arms):
            if i == best:
                continue
            ratio = max(min(values[i] / top, 1.0), 1e-3)
            wait = min(self.explore_every / ratio**6, self.explore_every * self.max_wait)
            if 0 < len(self.recent.get(self.cost_key(key, w), ())) < 3:  # timed once or twice: the first step at a
                wait = self.explore_every  # batch size runs cold (a served 4-row AR step 12.4 ms, then 7-9)
            overdue = (self.steps - self.last_run.get((key, w), 0)) / wait
            if overdue >= most:
                found, most = i, overdue
        return found

    def update(self, bands: list[int], accepted: list[int], width: int, seconds: float | None,
               spent: float | None = None) -> None:
        """Fold one step in: each row's band and accepted drafts, the width it ran at, its seconds — None
        for a draft step that also stored the context of AR steps before it (a backlog a step of this
        width pays once on switching, not every step): not timed, and, while the arm has fewer than
        `window` timings, the same width runs once more to time it (an exploration of a well-timed arm
        after AR steps is one draft step, not two: what it measures anew is acceptance). `spent`: what the
        step took, backlog included (default `seconds`): the exploration budget's currency — an exploration
        after AR steps is a backlog step, on the shipped pair at T 1.5 ~2 AR steps for ~1.15 tokens, and four
        arms each due every ~50 steps explored every 12th step: ~7% of the time."""
        spent = seconds if spent is None else spent
        if spent is not None:
            self.budget = min(self.budget + self.explore_share * spent, 100 * self.explore_share * spent)
            if self.exploring is not None:  # what this step lost to the best arm's tokens per second
                self.budget -= max(spent - (len(accepted) + sum(accepted)) / max(self.exploring, 1e-12), 0.0)
        self.exploring = None
        verified, width = width, min(self.arms, key=lambda w: abs(w - width))  # else the nearest arm counts
        key = self.cost_key(bands, width)
        if seconds is not None:
            self._time(key, seconds)
        elif width > 1 and len(self.recent.get(key, ())) < self.window:  # timed too few times: once more
            self.probe = (tuple(sorted(bands)), width)
        if width > 1:  # the positions and this arm's own tokens change
            self._tokens.clear()
        for band in set(bands):
            mine = [a for b, a in zip(bands, accepted) if b == band]
            self._fold(self.own, (band, width), 1 + sum(mine) / len(mine), 1.0, self.decay)
            for i in range(1, verified):  # a draft the confidence cut dropped counts as not accepted
                self._fold(self.position, (band, i), sum(a >= i for a in mine), len(mine), self.position_decay)
        self.last_run[tuple(sorted(bands)), width] = self.steps
        self.steps += 1
