"""Fault scenarios where the behaviour is the orchestrator's, on a manual clock: nothing
waits on real time, so they hold on a loaded machine. (tests/integration/test_faults.py
has one real-process SIGKILL test for each fault.)"""

from __future__ import annotations

import pytest

from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import StaleEvent
from hypersack.core.types import NodeSpec, TrialState
from hypersack.orchestrator import (
    Heartbeat,
    KillTrial,
    NodeJoined,
    Orchestrator,
    OrchestratorConfig,
    RunningTrial,
    StudySubmitted,
    Tick,
    TrialFailed,
    TrialFinished,
)
from hypersack.store import MemoryStore
from hypersack.testing.core import launches, make, space

TIMEOUT = 30.0


def _node(name: str, gpus: int = 1) -> NodeSpec:
    spec = parse_shorthand(f"1x{gpus}xA100-80GB").nodes[0]
    return spec.model_copy(update={"name": name})


def _lose_by_silence(orch: Orchestrator, clock: object, keep: str | None = None) -> None:
    clock.advance(TIMEOUT + 1)  # type: ignore[attr-defined]
    if keep is not None:
        orch.handle(Heartbeat(keep))
    orch.handle(Tick())


def test_a_superseded_attempt_is_killed_and_its_reports_change_nothing() -> None:
    orch, store, clock = make(heartbeat_timeout_s=TIMEOUT)
    orch.handle(NodeJoined(_node("a")))
    (first,) = launches(orch.handle(StudySubmitted(space(n_lr=1))))
    assert first.node == "a" and first.attempt == 1
    orch.handle(NodeJoined(_node("b")))
    _lose_by_silence(orch, clock, keep="b")  # a is silent: its trial runs again on b
    t = orch.trial(first.trial_id)
    assert t.state == TrialState.RUNNING and t.node == "b" and t.launches == 2
    # a comes back, still running attempt 1: that attempt goes, attempt 2 stays.
    cmds = orch.handle(NodeJoined(_node("a"), (RunningTrial(first.trial_id, 0, attempt=1),)))
    assert KillTrial(first.trial_id, "a", "attempt 1 was superseded by attempt 2",
                     attempt=1) in cmds
    for stale in (TrialFinished(first.trial_id, "a", {"loss": 0.1}, attempt=1),
                  TrialFailed(first.trial_id, "b", 3, attempt=1)):
        with pytest.raises(StaleEvent):
            orch.handle(stale)
    assert orch.trial(first.trial_id).state == TrialState.RUNNING
    orch.handle(TrialFinished(first.trial_id, "b", {"loss": 0.2}, attempt=2))
    t = orch.trial(first.trial_id)
    assert t.state == TrialState.COMPLETED and t.launches == 2 and t.metrics == {"loss": 0.2}
    assert store.get_trial(t.id) == t


@pytest.mark.parametrize("reconnects", [False, True])
def test_the_current_attempts_exit_counts_after_a_brief_node_loss(reconnects: bool) -> None:
    orch, store, clock = make(heartbeat_timeout_s=TIMEOUT)
    orch.handle(NodeJoined(_node("a")))
    (first,) = launches(orch.handle(StudySubmitted(space(n_lr=1))))
    _lose_by_silence(orch, clock)  # no other node: it waits, PENDING
    assert orch.trial(first.trial_id).state == TrialState.PENDING
    if reconnects:
        # The agent registers again listing the attempt (running, or exited and not yet
        # reported): adopted, not launched a second time.
        cmds = orch.handle(NodeJoined(_node("a"), (RunningTrial(first.trial_id, 0,
                                                                attempt=1),)))
        assert launches(cmds) == []
    # Its exit arrives late: the work was done, and it counts once.
    orch.handle(TrialFinished(first.trial_id, "a", {"loss": 0.3}, attempt=1))
    t = orch.trial(first.trial_id)
    assert t.state == TrialState.COMPLETED and t.launches == 1
    assert orch.studies()[0].state.value == "COMPLETED"
    assert store.get_trial(t.id) == t


def test_a_register_that_omits_a_trial_requeues_it_and_a_heartbeat_does_not() -> None:
    orch, _, _ = make(heartbeat_timeout_s=TIMEOUT)
    orch.handle(NodeJoined(_node("a", gpus=1)))
    two = launches(orch.handle(StudySubmitted(space(n_lr=2))))
    assert len(two) == 2
    kept, gone = two
    orch.handle(Heartbeat("a", (RunningTrial(kept.trial_id, 0, attempt=1),)))
    assert orch.trial(gone.trial_id).state == TrialState.RUNNING  # a heartbeat may lag
    cmds = orch.handle(NodeJoined(_node("a"), (RunningTrial(kept.trial_id, 0, attempt=1),)))
    # The re-registered agent does not run it: it goes back to pending and runs again.
    again = launches(cmds)
    assert [c.trial_id for c in again] == [gone.trial_id] and again[0].attempt == 2
    assert orch.trial(kept.trial_id).launches == 1


def test_restored_nodes_get_a_grace_period_before_silence_counts() -> None:
    orch, store, clock = make(heartbeat_timeout_s=TIMEOUT)
    orch.handle(NodeJoined(_node("a")))
    (first,) = launches(orch.handle(StudySubmitted(space(n_lr=1))))
    clock.advance(TIMEOUT - 1)
    # The server restarts: its nodes get restore_grace_s more before they are lost.
    again = Orchestrator(store, clock, OrchestratorConfig(heartbeat_timeout_s=TIMEOUT,
                                                          restore_grace_s=20.0))
    clock.advance(TIMEOUT + 5)
    again.handle(Tick())
    assert again.has_node("a") and again.trial(first.trial_id).state == TrialState.RUNNING
    # The agent reconnects within the grace and reports its trial: adopted, not re-run.
    again.handle(NodeJoined(_node("a"), (RunningTrial(first.trial_id, 0, attempt=1),)))
    again.handle(TrialFinished(first.trial_id, "a", {"loss": 0.1}, attempt=1))
    assert again.trial(first.trial_id).launches == 1
    # A node that never comes back is lost once the grace is over.
    other = Orchestrator(store, clock, OrchestratorConfig(heartbeat_timeout_s=TIMEOUT,
                                                          restore_grace_s=20.0))
    clock.advance(TIMEOUT + 21)
    other.handle(Tick())
    assert not other.has_node("a")


def test_a_restart_between_launch_and_report_runs_nothing_twice() -> None:
    store = MemoryStore()
    orch, _, clock = make(store=store, heartbeat_timeout_s=TIMEOUT)
    orch.handle(NodeJoined(_node("a", gpus=2)))
    first = launches(orch.handle(StudySubmitted(space(n_lr=4))))
    again = Orchestrator(store, clock, OrchestratorConfig(heartbeat_timeout_s=TIMEOUT))
    cmds = again.handle(NodeJoined(_node("a", gpus=2), tuple(
        RunningTrial(c.trial_id, c.gpu_index, attempt=c.attempt) for c in first)))
    assert launches(cmds) == [] and not any(isinstance(c, KillTrial) for c in cmds)
    for c in first:
        again.handle(TrialFinished(c.trial_id, "a", {"loss": 0.5}, attempt=c.attempt))
    assert {t.launches for t in again.trials()} == {1}
