"""The trial state machine: which transitions are legal, in one table."""

from __future__ import annotations

from hypersack.core.errors import StaleEvent
from hypersack.core.types import TrialState

S = TrialState

TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    # PENDING <-> PROFILING: the workload waits for (or regains) a profile.
    # PENDING -> COMPLETED: the exit of its last attempt arrived after a brief node loss.
    S.PENDING: frozenset({S.PROFILING, S.RUNNING, S.COMPLETED, S.FAILED, S.DIVERGED,
                          S.CANCELLED}),
    # PROFILING -> RUNNING: a reconnecting agent reports it still runs the trial.
    S.PROFILING: frozenset({S.PENDING, S.RUNNING, S.FAILED, S.CANCELLED}),
    # RUNNING -> PENDING: retried after a failure, out of memory, or a lost node.
    # PENDING -> DIVERGED: likewise, with a non-finite objective.
    # RUNNING -> DIVERGED: it reported a non-finite objective or crossed a stop_if bound.
    S.RUNNING: frozenset({S.PENDING, S.COMPLETED, S.FAILED, S.DIVERGED, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.DIVERGED: frozenset(),
    S.CANCELLED: frozenset(),
}


def check_transition(trial_id: str, old: TrialState, new: TrialState) -> None:
    if new not in TRANSITIONS[old]:
        raise StaleEvent(f"trial {trial_id}: no transition {old.value} -> {new.value}")
