"""The trial state machine: which transitions are legal, in one table."""

from __future__ import annotations

from hypersack.core.errors import StaleEvent
from hypersack.core.types import TrialState

S = TrialState

TRANSITIONS: dict[TrialState, frozenset[TrialState]] = {
    # PENDING <-> PROFILING: the workload waits for (or regains) a profile.
    # PENDING -> COMPLETED: the exit of its last attempt arrived after a brief node loss.
    # PENDING -> PAUSED: likewise, an exit at a rung.
    S.PENDING: frozenset({S.PROFILING, S.RUNNING, S.COMPLETED, S.FAILED, S.DIVERGED,
                          S.CANCELLED, S.PAUSED}),
    # PROFILING -> RUNNING: a reconnecting agent reports it still runs the trial.
    S.PROFILING: frozenset({S.PENDING, S.RUNNING, S.FAILED, S.CANCELLED}),
    # RUNNING -> PENDING: retried after a failure, out of memory, or a lost node.
    # PENDING -> DIVERGED: likewise, with a non-finite objective.
    # RUNNING -> DIVERGED: it reported a non-finite objective or crossed a stop_if bound.
    # RUNNING -> PRUNED: it ranked too low at a rung; RUNNING -> PAUSED: it stopped at a
    # rung with its checkpoint, to be ranked.
    S.RUNNING: frozenset({S.PENDING, S.COMPLETED, S.FAILED, S.DIVERGED, S.CANCELLED,
                          S.PRUNED, S.PAUSED}),
    # PAUSED -> PENDING: promoted, it resumes from its checkpoint.
    S.PAUSED: frozenset({S.PENDING, S.PRUNED, S.CANCELLED}),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset(),
    S.DIVERGED: frozenset(),
    S.CANCELLED: frozenset(),
    S.PRUNED: frozenset(),
}


def check_transition(trial_id: str, old: TrialState, new: TrialState) -> None:
    if new not in TRANSITIONS[old]:
        raise StaleEvent(f"trial {trial_id}: no transition {old.value} -> {new.value}")
