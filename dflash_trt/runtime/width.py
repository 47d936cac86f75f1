"""Verify widths: how many tokens a decode step verifies per row (the bonus + its drafts).

Two policies, `runtime.width_policy`:

- ``schedule``: the bundle's block size, or a smaller one from `block_size_schedule` ({batch size: block
  size}, each key up) for busy steps. TensorRT-LLM's `draft_len_schedule` is the same table. Where extra
  verify rows are nearly free (GPUs) the full block is right.
- ``measured``: `MeasuredWidth` picks each step's width from what this machine measured: acceptance per
  temperature band and step seconds per width and batch size, down to width 1 (a plain autoregressive
  step: no draft pass). It pays where verify rows cost (CPUs), and at high temperatures, where drafts
  are rarely accepted.
- ``auto`` (the default): ``measured`` on CPU, ``schedule`` elsewhere.

Which tokens are committed never depends on the width: every committed token is the target's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_trt.engine.config import WIDTH_POLICIES

TEMPERATURE_BANDS = (0.0, 0.5, 1.0)  # band 0: greedy; 1: (0, 0.5]; 2: (0.5, 1.0]; 3: above 1.0


def temperature_band(temperature: float) -> int:
    """Acceptance is measured per band: a sampled request accepts far fewer drafts than a greedy one."""
    if temperature <= 0.0:
        return 0
    return 1 + sum(temperature > b for b in TEMPERATURE_BANDS[1:])


def resolve_policy(policy: str, device_type: str) -> str:
    """`policy` with ``auto`` made concrete for a device type ('cpu', 'cuda', ...)."""
    if policy not in WIDTH_POLICIES:
        raise ValueError(f"width_policy must be one of {', '.join(WIDTH_POLICIES)}, got {policy!r}")
    if policy == "auto":
        return "measured" if device_type == "cpu" else "schedule"
    return policy


def scheduled_width(block_size: int, schedule: dict[int, int] | None, batch: int) -> int:
    """The schedule's width for `batch` rows: the entry with the largest key <= batch, capped at block_size."""
    width = block_size
    for threshold, block in sorted((schedule or {}).items()):
        if batch >= threshold:
            width = min(block_size, block)
    return width


class ScheduledWidth:
    """The ``schedule`` policy: a width from the batch size alone."""

    def __init__(self, block_size: int, schedule: dict[int, int] | None = None):
        self.block_size, self.schedule = block_size, dict(schedule or {})

    def width(self, bands: list[int]) -> int:
        return scheduled_width(self.block_size, self.schedule, len(bands))

    def update(self, bands, accepted, width, seconds, spent=None) -> None:
        """A fixed schedule learns nothing."""


@dataclass(frozen=True)
class MeasuredConstants:
    """The measured policy's constants (`MeasuredWidth` says what each does)."""

    decay: float = 0.99  # per step, of each arm's own mean tokens
    position_decay: float = 0.995  # per step, of the pooled per-position acceptance
    prior: float = 16.0  # own steps that weigh as much as the pooled estimate
    explore_every: int = 12  # at most one exploration in this many steps (0: never)
    max_wait: int = 50  # an arm is due at the latest after max_wait x explore_every steps
    margin: float = 0.05  # the arm in use is kept unless another measures this much better
    window: int = 7  # draft-step timings kept per (batch, width, sampled)
    ar_window: int = 31  # AR-step timings kept: they come in bursts (slow after admissions)
    explore_share: float = 0.03  # of the time, at most, spent on what explorations lose
    fixed_greedy: bool = True  # all-greedy steps of one row (or any, with a schedule) take the schedule's width


class MeasuredWidth:
    """The verify width of each step from what this machine measured, arm by arm.

    The arms are widths 1 (a plain autoregressive step: no draft pass; the draft runner stores its context
    with the next draft pass), 2, 4, 8, ... and the full block. Measured directly, so whatever else shapes a
    step (the confidence cut, the draft vocabulary, sampling costs) is in the numbers:

        position[band, i] the share of rows whose first i drafts were accepted (decayed counts), from every
                          step that verified past draft i, whatever its width: a wide step informs every
                          narrower arm, so a rarely run arm is not judged on a handful of its own steps
        own[band, w]      committed tokens per row per step of arm w itself (decayed mean and weight)
        seconds[B, w, s]  seconds of a step of B rows (s: some row samples) over its recent steps: for AR
                          steps the lower median (a lone AR step among draft steps runs cold; stalls only
                          add time), for draft steps, which verify 1..w rows as the confidence cut and
                          acceptance go, the mean of those within twice the median

    An arm's expected tokens per row are 1 + sum_{i<w} position[band, i], moved towards its own mean as its
    own steps accumulate (`prior` own steps weigh as much as the pooled estimate): a narrow block drafts a
    little differently from the first positions of a wide one.

    For a batch whose rows are in bands b_r it picks  w* = argmax_w  sum_r tokens[b_r, w] / seconds[B, w],
    keeping the arm in use unless another measures `margin` better, so a width measuring slower than AR is
    not kept: DFlash does not lose to autoregressive decoding by its own measurements. An arm not yet
    measured for this batch runs first, widest first (a new batch size times its AR step first and
    estimates the rest from the nearest size timed both ways). After that the other arms are explored, at
    most one step in `explore_every`, each when due: `explore_every / r**6` steps after it last ran (r = its
    value / the best's), and explorations spend at most `explore_share` of the time on what they lose.
    Hopeless arms are rarely paid for, while drift (acceptance moves with the text, the machine with its
    load) is still found. Lossless at any width.
    """

    def __init__(self, max_width: int, constants: MeasuredConstants = MeasuredConstants(),
                 schedule: dict[int, int] | None = None):
        if max_width < 2:
            raise ValueError(f"max_width must be >= 2, got {max_width}")
        self.max_width, self.c, self.schedule = max_width, constants, dict(schedule or {})
        self.arms = sorted({1, max_width, *(1 << i for i in range(1, max_width.bit_length()) if 1 << i < max_width)})
        self.position: dict[tuple[int, int], list[float]] = {}  # (band, i) -> [rows accepting draft i, rows]
        self.own: dict[tuple[int, int], list[float]] = {}  # (band, arm) -> [tokens per row, steps], decayed
        self.seconds: dict[tuple[int, int, bool], float] = {}
        self.recent: dict[tuple[int, int, bool], list[float]] = {}  # recent step seconds per cost key
        self.held: dict[tuple, int] = {}  # batch composition -> index of the arm in use
        self.last_run: dict[tuple, int] = {}  # (batch composition, width) -> step it last ran
        self.last_explored: dict[tuple, int] = {}  # batch composition -> step of its last exploration
        self.probe: tuple | None = None  # (batch composition, width): run once more, its last step was not timed
        # `budget` (seconds) grows by explore_share of every step and pays each exploration's loss; `exploring`
        # is the best arm's value (tokens / s) while an exploration (or its timing probe) runs
        self.budget, self.exploring, self.explored_best = 0.0, None, None
        # expected tokens per (band, width), kept until a draft step changes what they are computed from (a run
        # of AR steps asks every step and changes none of them)
        self._tokens: dict[tuple[int, int], float | None] = {}
        self.steps = 0

    @property
    def window(self) -> int:
        return self.c.window

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
        return (own[0] + self.c.prior * estimate) / (own[1] + self.c.prior)

    @staticmethod
    def cost_key(bands: list[int], width: int) -> tuple[int, int, bool]:
        """What a step's seconds are measured by: rows, width, and whether some row samples."""
        return len(bands), width, any(bands)

    def _time(self, key: tuple[int, int, bool], seconds: float) -> None:
        recent = self.recent.setdefault(key, [])
        recent.append(seconds)
        del recent[: -(self.c.ar_window if key[1] == 1 else self.c.window)]
        middle = sorted(recent)[(len(recent) - 1) // 2]
        if key[1] == 1:
            self.seconds[key] = middle
            return
        kept = [s for s in recent if s <= 2 * middle]
        self.seconds[key] = sum(kept) / len(kept)

    def value(self, bands: list[int], width: int) -> float | None:
        """Expected committed tokens per second of a step at `width`, or None if not measured (nor estimable)."""
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
        row count's AR step plus the extra seconds there per row times these rows (a draft step's extra verify
        rows and draft pass grow with the rows; an AR step's shared weight stream does not)."""
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
        if self.c.fixed_greedy and not any(bands) and (self.schedule or len(bands) == 1):
            # a lone greedy request: acceptance is high and steady, and the measured choice between near-equal
            # wide arms would wander with timing noise
            return scheduled_width(self.max_width, self.schedule, len(bands))
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
        held = self.held.get(key)
        if held is not None and values[held] * (1 + self.c.margin) >= values[best]:
            best = held
        self.held[key] = best
        if (self.c.explore_every and self.budget >= 0
                and self.steps - self.last_explored.get(key, -self.c.explore_every) >= self.c.explore_every):
            due = self._due(key, values, best)
            if due is not None:
                self.last_explored[key] = self.steps
                self.exploring = self.explored_best = values[best]
                return self.arms[due]
        return self.arms[best]

    def _due(self, key: tuple, values: list[float], best: int) -> int | None:
        """The most overdue arm other than `best`, or None when none is due."""
        top, found, most = max(values[best], 1e-12), None, 1.0
        every = self.c.explore_every
        for i, w in enumerate(self.arms):
            if i == best:
                continue
            ratio = max(min(values[i] / top, 1.0), 1e-3)
            wait = min(every / ratio**6, every * self.c.max_wait)
            if 0 < len(self.recent.get(self.cost_key(key, w), ())) < 3:  # timed once or twice: a batch size's
                wait = every  # first step runs cold, so recheck it soon
            overdue = (self.steps - self.last_run.get((key, w), 0)) / wait
            if overdue >= most:
                found, most = i, overdue
        return found

    def update(self, bands: list[int], accepted: list[int], width: int, seconds: float | None,
               spent: float | None = None) -> None:
        """Fold one step in: each row's band and accepted drafts, the width it ran at, its seconds — None for
        a draft step that also stored the context of AR steps before it (a backlog paid once per switch, not
        every step): not timed, and while the arm has fewer than `window` timings the same width runs once
        more to time it. `spent`: what the step took, backlog included (default `seconds`), the exploration
        budget's currency."""
        spent = seconds if spent is None else spent
        if spent is not None:
            share = self.c.explore_share
            self.budget = min(self.budget + share * spent, 100 * share * spent)
            if self.exploring is not None:  # what this step lost to the best arm's tokens per second
                self.budget -= max(spent - (len(accepted) + sum(accepted)) / max(self.exploring, 1e-12), 0.0)
        self.exploring = None
        verified, width = width, min(self.arms, key=lambda w: abs(w - width))  # else the nearest arm counts
        key = self.cost_key(bands, width)
        if seconds is not None:
            self._time(key, seconds)
        elif width > 1 and len(self.recent.get(key, ())) < self.c.window:
            self.probe = (tuple(sorted(bands)), width)
        if width > 1:
            self._tokens.clear()
        for band in set(bands):
            mine = [a for b, a in zip(bands, accepted) if b == band]
            self._fold(self.own, (band, width), 1 + sum(mine) / len(mine), 1.0, self.c.decay)
            for i in range(1, verified):  # a draft the confidence cut dropped counts as not accepted
                self._fold(self.position, (band, i), sum(a >= i for a in mine), len(mine), self.c.position_decay)
        self.last_run[tuple(sorted(bands)), width] = self.steps
        self.steps += 1


def policy_for(policy: str, device_type: str, block_size: int,
                 schedule: dict[int, int] | None = None) -> ScheduledWidth | MeasuredWidth:
    """The policy object for `runtime.width_policy` on this device type."""
    if block_size < 2 or resolve_policy(policy, device_type) == "schedule":
        return ScheduledWidth(block_size, schedule)
    return MeasuredWidth(block_size, schedule=schedule)
