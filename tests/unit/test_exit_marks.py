"""An exit's mark as handled (TrialRecord.exited) rides with the trial's change that the
exit causes, whichever way the exit goes: the record changes once per exit, a repeat of
the exit is stale, a heartbeat that still lists the attempt neither kills nor adopts it,
and an exit whose handling is undone leaves no mark behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import StaleEvent
from hypersack.core.types import Demand, Profile, TrialRecord, TrialState, WorkloadKey
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    Heartbeat,
    NodeDrained,
    NodeJoined,
    Orchestrator,
    OrchestratorConfig,
    RunningTrial,
    StudySubmitted,
    TrialFailed,
    TrialFinished,
    TrialOutOfMemory,
    launched,
)
from hypersack.orchestrator.commands import KillTrial
from hypersack.store import MemoryStore


def _orchestrator() -> Orchestrator:
    store = MemoryStore()
    store.put_profile(Profile(key=WorkloadKey(model="resnet18", batch_size=64), arch="A100",
                              demand=Demand(compute_pct=40, memory_mib=1000, cores=1),
                              iter_time_s=0.1, iters_per_epoch=10))
    orch = Orchestrator(store, ManualClock(100.0), OrchestratorConfig())
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB@8").nodes[0]))
    return orch


def _space(retries: int = 2, objective: str = "loss") -> Any:
    return parse_space({"name": "t", "models": ["resnet18"],
                        "hyperparameters": {"batch_size": [64], "lr": [0.1, 0.2]},
                        "settings": {"fusion": "off", "retries": retries,
                                     "objective": {"metric": objective, "mode": "min"}}})


# Each way an exit goes: the event for trial `tid`'s attempt, the space, and the state
# the trial ends in.
EXITS: dict[str, tuple[Callable[[str, int], Any], Any, TrialState]] = {
    "completed": (lambda tid, a: TrialFinished(tid, "node0", {"loss": 0.5}, attempt=a),
                  _space(), TrialState.COMPLETED),
    "diverged": (lambda tid, a: TrialFinished(tid, "node0", {}, attempt=a,
                                              nonfinite=("loss",)),
                 _space(), TrialState.DIVERGED),
    "without its objective": (lambda tid, a: TrialFinished(tid, "node0", {"acc": 1.0},
                                                           attempt=a),
                              _space(), TrialState.FAILED),
    "failed, runs again": (lambda tid, a: TrialFailed(tid, "node0", 1, "boom", attempt=a),
                           _space(retries=2), TrialState.PENDING),
    "failed for good": (lambda tid, a: TrialFailed(tid, "node0", 1, "boom", attempt=a),
                        _space(retries=0), TrialState.FAILED),
    "fenced": (lambda tid, a: TrialFailed(tid, "node0", 1, "", attempt=a, fenced=True),
               _space(), TrialState.PENDING),
    "out of memory": (lambda tid, a: TrialOutOfMemory(tid, "node0", 2000, attempt=a),
                      _space(), TrialState.PENDING),
}


@pytest.mark.parametrize("how", sorted(EXITS))
def test_an_exit_marks_its_attempt_in_the_change_it_causes(how: str) -> None:
    event_of, space, state = EXITS[how]
    orch = _orchestrator()
    t = launched(orch.handle(StudySubmitted(space)))[0]
    orch.handle(NodeDrained("node0"))  # nothing launches again on it meanwhile
    changes: list[tuple[TrialRecord, TrialRecord]] = []
    orch.book.on_transition.append(lambda old, new: changes.append((old, new)))
    orch.handle_batch([event_of(t.trial_id, t.attempt)])
    record = orch.trial(t.trial_id)
    assert record.state == state
    assert record.exited == t.attempt
    mine = [new for old, new in changes if new.id == t.trial_id]
    assert len(mine) == 1  # one change: the exit's outcome and its mark together
    with pytest.raises(StaleEvent) as caught:
        orch.handle(event_of(t.trial_id, t.attempt))
    assert caught.value.expected
    assert orch.trial(t.trial_id) == record  # the repeat changed nothing
    # The agent lists the attempt until the exit's acknowledgement reaches it: no kill,
    # and the trial is not taken back as running there.
    out = orch.handle(Heartbeat("node0", (RunningTrial(t.trial_id, 0, attempt=t.attempt),)))
    assert not [c for c in out if isinstance(c, KillTrial)]
    assert orch.trial(t.trial_id).state == state


def test_an_exit_whose_handling_is_undone_leaves_no_mark() -> None:
    orch = _orchestrator()
    t = launched(orch.handle(StudySubmitted(_space())))[0]
    release = orch.book.release

    def broken(trial_id: str) -> None:
        raise RuntimeError("a bug in the exit's handling")

    orch.book.release = broken  # type: ignore[method-assign]
    result = orch.handle_batch([TrialFinished(t.trial_id, "node0", {"loss": 0.5},
                                              attempt=t.attempt)])
    orch.book.release = release  # type: ignore[method-assign]
    assert result.refused and not result.stale
    record = orch.trial(t.trial_id)
    assert record.state == TrialState.RUNNING and record.exited == 0
    assert orch.s.exit_marks == {}
    # The same exit, sent again, now counts; a later change of another kind carries no
    # mark from the undone one.
    orch.handle(TrialFinished(t.trial_id, "node0", {"loss": 0.5}, attempt=t.attempt))
    assert orch.trial(t.trial_id).state == TrialState.COMPLETED
    assert orch.trial(t.trial_id).exited == t.attempt


def test_two_exits_in_one_batch_each_mark_their_own_trial() -> None:
    orch = _orchestrator()
    a, b = launched(orch.handle(StudySubmitted(_space())))[:2]
    result = orch.handle_batch([
        TrialFinished(a.trial_id, "node0", {"loss": 0.5}, attempt=a.attempt),
        TrialFailed(b.trial_id, "node0", 1, "boom", attempt=b.attempt),
        TrialFinished(a.trial_id, "node0", {"loss": 0.5}, attempt=a.attempt),  # a copy
    ])
    assert len(result.stale) == 1 and result.stale[0].expected
    assert orch.trial(a.trial_id).exited == a.attempt
    assert orch.trial(b.trial_id).exited == b.attempt
    assert orch.trial(b.trial_id).failures == 1
