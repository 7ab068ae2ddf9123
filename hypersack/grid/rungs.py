"""Early stopping: a pruner's rungs and its decisions, as pure functions of the study's
pruner and the objective values its trials reported at the rungs.

ASHA (Li et al., asynchronous successive halving): rungs at r, r*eta, r*eta^2, ...
epochs below the last epoch. A trial that reached a rung goes on if it is among the best
1/eta of the trials ranked at that rung. In `pause` mode a trial stops at each rung and
waits, PAUSED, until it is promoted (among the best 1/eta of the rung's trials, which
only grow) or provably never will be (PRUNED); in `stop` mode it runs on and is stopped
when it ranks outside the best 1/eta of the values recorded so far (Optuna's rule: the
best max(1, n // eta) go on).

Hyperband: brackets 0..s, bracket b starting at rung r*eta^b (the last bracket has no
rung: its trials run to the end); trials are dealt to brackets by their number, and
ranked only within their bracket.

Median: a trial whose objective at an epoch (from `min_epochs` on) is worse than the
median of the other trials' values at that epoch stops, once `min_trials` others have one.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Iterable, Mapping

from hypersack.grid.settings import Pruner


def first_rungs(pruner: Pruner, epochs: float) -> tuple[int, ...]:
    """Bracket 0's rungs: the epochs below the last at which trials are ranked."""
    if pruner.type == "median":
        return tuple(range(pruner.min_epochs, math.ceil(epochs)))
    out: list[int] = []
    r = pruner.min_epochs
    while r < epochs and len(out) < 64:
        out.append(r)
        r *= pruner.reduction_factor
    return tuple(out)


def brackets(pruner: Pruner, epochs: float) -> int:
    """How many brackets: Hyperband's one per starting rung plus one without rungs."""
    if pruner.type != "hyperband":
        return 1
    return len(first_rungs(pruner, epochs)) + 1


def bracket_of(pruner: Pruner, epochs: float, ordinal: int) -> int:
    return ordinal % brackets(pruner, epochs)


def rungs(pruner: Pruner, epochs: float, bracket: int) -> tuple[int, ...]:
    """The rungs of a bracket: Hyperband's bracket b skips the first b rungs."""
    return first_rungs(pruner, epochs)[bracket:]


def next_rung(ladder: Iterable[int], done: float) -> int | None:
    """The first rung past `done` epochs (None: none left, the trial runs to the end)."""
    return next((r for r in ladder if r > done + 1e-9), None)


def better(a: float, b: float, minimize: bool) -> bool:
    return a < b if minimize else a > b


def ranked(values: Mapping[str, float], minimize: bool) -> list[str]:
    """Trial ids best first; ties by id, so every decision is reproducible."""
    sign = 1.0 if minimize else -1.0
    return sorted(values, key=lambda tid: (sign * values[tid], tid))


def keeps(value: float, recorded: Iterable[float], eta: int, minimize: bool) -> bool:
    """Stop mode: does a trial with `value` at a rung go on, among the values recorded
    there (its own included)? The best max(1, n // eta) go on."""
    ordered = sorted(recorded, reverse=not minimize)
    if not ordered:
        return True
    cutoff = ordered[max(1, len(ordered) // eta) - 1]
    return not better(cutoff, value, minimize)


def promoted_count(ranked_at_rung: int, eta: int) -> int:
    """Pause mode: how many of the trials ranked at a rung go on (the best n // eta)."""
    return ranked_at_rung // eta


def most_ranked(total: int, eta: int, rung_index: int) -> int:
    """The most trials a bracket of `total` trials can ever rank at its rung number
    `rung_index` (0: the first): each rung promotes at most n // eta."""
    n = total
    for _ in range(rung_index):
        n //= eta
    return n


def never_promoted(rank: int, total: int, eta: int, rung_index: int) -> bool:
    """A trial ranked `rank` (0: best) at a rung cannot be promoted however the other
    trials do: ranks only worsen as values arrive, and at most `most_ranked // eta` go
    on. The best of a rung always may (the study's end promotes it)."""
    return rank >= max(1, most_ranked(total, eta, rung_index) // eta)


def bracket_size(total: int, count: int, bracket: int) -> int:
    """How many of `total` trials, dealt in turn to `count` brackets, land in one."""
    return total // count + (1 if bracket < total % count else 0)


def median_prunes(value: float, others: Iterable[float], min_trials: int,
                  minimize: bool) -> bool:
    values = list(others)
    if len(values) < min_trials:
        return False
    return better(statistics.median(values), value, minimize)


class Ranking:
    """The values the trials of one bracket reported at one rung, best first, and the
    trials paused there: a trial's rank in O(log n), so a decision costs what changed,
    not the study's size."""

    def __init__(self, minimize: bool) -> None:
        self._sign = 1.0 if minimize else -1.0
        self._values: list[tuple[float, str]] = []  # (sign x value, trial id), ascending
        self.paused: set[str] = set()

    def __len__(self) -> int:
        return len(self._values)

    def add(self, trial_id: str, value: float) -> None:
        bisect.insort(self._values, (self._sign * value, trial_id))

    def rank(self, trial_id: str, value: float) -> int:
        """Its place, 0 the best (ties by trial id)."""
        return bisect.bisect_left(self._values, (self._sign * value, trial_id))

    def better(self, value: float) -> int:
        """How many reported a strictly better value."""
        return bisect.bisect_left(self._values, (self._sign * value, ""))

    def keeps(self, value: float, eta: int) -> bool:
        """Stop mode (see `keeps`): among the best max(1, n // eta), ties kept."""
        return self.better(value) < max(1, len(self._values) // eta)

    def median_prunes(self, trial_id: str, value: float, min_trials: int) -> bool:
        """The median rule against the others' values (see `median_prunes`)."""
        others = len(self._values) - 1
        if others < min_trials:
            return False
        own = self.rank(trial_id, value)

        def other(k: int) -> float:
            return self._values[k if k < own else k + 1][0]

        mid = others // 2
        median = other(mid) if others % 2 else (other(mid - 1) + other(mid)) / 2
        return self._sign * value > median  # both signed: larger is worse
