"""No exit lost, none counted twice: agents keep each exit until the server acknowledges it
as committed and send it again until then; a repeated exit changes nothing; a trial that a
node's heartbeats leave out for longer than a grace, with no exit, runs again."""

from __future__ import annotations

import queue
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent.agent import Agent
from hypersack.agent.devices import FakeBackend
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
from hypersack.server.service import SchedulerService
from hypersack.store import MemoryStore
from hypersack.testing.server import ONE_A100, first_launch, profiled_store, wait
from hypersack.testing.stores import FailingStore
from hypersack.wire.convert import ack_id


def _orchestrator(clock: ManualClock, grace_s: float = 10.0) -> Orchestrator:
    store = MemoryStore()
    store.put_profile(Profile(key=WorkloadKey(model="resnet18", batch_size=64), arch="A100",
                              demand=Demand(compute_pct=40, memory_mib=1000, cores=1),
                              iter_time_s=0.1, iters_per_epoch=10))
    orch = Orchestrator(store, clock, OrchestratorConfig(missing_grace_s=grace_s))
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB@8").nodes[0]))
    return orch


def _space(n: int = 2, retries: int = 2) -> Any:
    return parse_space({"name": "t", "models": ["resnet18"],
                        "hyperparameters": {"batch_size": [64],
                                            "lr": [0.1 * (i + 1) for i in range(n)]},
                        "settings": {"fusion": "off", "retries": retries}})


def test_a_repeated_exit_of_a_handled_attempt_is_stale() -> None:
    orch = _orchestrator(ManualClock(100.0))
    t = launched(orch.handle(StudySubmitted(_space(n=3))))[0]
    orch.handle(NodeDrained("node0"))  # so that it waits, PENDING, after its failure
    orch.handle(TrialFailed(t.trial_id, "node0", 1, "boom", attempt=t.attempt))
    assert orch.trial(t.trial_id).failures == 1
    assert orch.trial(t.trial_id).state == TrialState.PENDING
    try:
        orch.handle(TrialFailed(t.trial_id, "node0", 1, "boom", attempt=t.attempt))
        raise AssertionError("a repeated exit should be stale")
    except StaleEvent as exc:
        assert "handled already" in str(exc)
        assert exc.expected  # a copy the agent sent again: logged at info, not warned of
    assert orch.trial(t.trial_id).failures == 1  # counted once


def test_a_trial_left_out_of_heartbeats_past_the_grace_runs_again() -> None:
    clock = ManualClock(100.0)
    orch = _orchestrator(clock, grace_s=10.0)
    first = launched(orch.handle(StudySubmitted(_space(n=2))))
    a, b = (c.trial_id for c in first)
    both = (RunningTrial(a, 0, attempt=1), RunningTrial(b, 0, attempt=1))
    only_a = both[:1]
    orch.handle(Heartbeat("node0", both))
    orch.handle(Heartbeat("node0", only_a))  # b left out: its launch may be in flight
    clock.advance(10.0)
    assert orch.handle(Heartbeat("node0", only_a)) == []
    assert orch.trial(b).state == TrialState.RUNNING  # within the grace
    clock.advance(0.5)
    again = launched(orch.handle(Heartbeat("node0", only_a)))
    t = orch.trial(b)
    assert "left out of its heartbeats" in t.reason and t.failures == 0
    assert [(c.trial_id, c.attempt) for c in again] == [(b, 2)]  # its next attempt
    # A trial listed again before the grace ends starts the count afresh.
    orch.handle(Heartbeat("node0", (both[0],)))
    clock.advance(8.0)
    orch.handle(Heartbeat("node0", (both[0], RunningTrial(b, 0, attempt=2))))
    clock.advance(8.0)
    orch.handle(Heartbeat("node0", (both[0],)))
    assert orch.trial(b).state == TrialState.RUNNING


def test_a_repeated_quiet_heartbeat_is_skipped_and_any_change_is_reconciled() -> None:
    """A node's heartbeat that repeats its last list, with nothing changed on the node
    since, is not reconciled again (a thousand a second at a thousand nodes); a change
    on either side is: a trial the server thinks runs there, a trial it does not know,
    and what another event changed on the node."""
    clock = ManualClock(100.0)
    orch = _orchestrator(clock, grace_s=10.0)
    a, b = (c.trial_id for c in launched(orch.handle(StudySubmitted(_space(n=2)))))
    both = (RunningTrial(a, 0, attempt=1), RunningTrial(b, 0, attempt=1))
    node = orch.s.cluster.live("node0")
    assert orch.handle(Heartbeat("node0", both)) == []
    quiet = node.quiet
    assert quiet is not None and quiet[1] == both
    assert orch.handle(Heartbeat("node0", both)) == []
    assert node.quiet == quiet  # skipped: nothing to do, nothing recomputed
    # The node changes (b fails and runs again, attempt 2, there): the same list is
    # reconciled again, and b's first attempt, listed still, is killed.
    orch.handle(TrialFailed(b, "node0", 1, "boom", attempt=1))
    assert orch.trial(b).launches == 2
    kills = orch.handle(Heartbeat("node0", both))
    assert [(k.trial_id, k.attempt) for k in kills] == [(b, 1)]
    # An unknown trial listed: killed, and killed again at each heartbeat that lists it.
    ghost = (*both[:1], RunningTrial(b, 0, attempt=2), RunningTrial("ghost", 0, attempt=1))
    for _ in range(2):
        kills = orch.handle(Heartbeat("node0", ghost))
        assert [k.trial_id for k in kills] == ["ghost"]
    # b's second attempt, which the node then leaves out, is found missing past the
    # grace, however alike the heartbeats are.
    for _ in range(3):
        assert orch.handle(Heartbeat("node0", both[:1])) == []
    clock.advance(10.5)
    orch.handle(Heartbeat("node0", both[:1]))
    assert orch.trial(b).launches == 3


def _until(what: Callable[[], object]) -> None:
    wait(what, 30.0)


def test_the_server_acknowledges_an_exit_only_once_committed(tmp_path: Path) -> None:
    inner = profiled_store(tmp_path / "s.db")
    store = FailingStore(inner)
    svc = SchedulerService(store, tick_interval_s=0.05)
    svc.start()
    try:
        session = svc.register(ONE_A100)
        svc.submit("name: tiny\nmodels: [resnet18]\nhyperparameters: {batch_size: [64], "
                   "lr: [0.1, 0.2]}\nsettings: {fusion: 'off'}\nprogram: {builtin: sleep}\n",
                   "tiny.yaml")
        launch = first_launch(session)
        exit_msg = pb.AgentMessage(exited=pb.TrialExited(
            trial_id=launch.trial_id, exit_code=1, attempt=launch.attempt, log_tail="boom"))
        store.fail_commits = 1
        svc.agent_message(session, exit_msg)
        _until(lambda: store.failures == 1)
        _until(lambda: svc.store_failure is None)  # the tick retried it, and committed
        assert not any(m is not None and m.HasField("acked") for m in session.drain())
        svc.agent_message(session, exit_msg)  # the agent sends it again: stale, acknowledged
        acked: list[str] = []
        _until(lambda: bool(acked.extend(m.acked.id for m in session.drain()
                                         if m is not None and m.HasField("acked"))
                            or acked))
        assert acked == [ack_id(exit_msg)]
        assert svc.orch.trial(launch.trial_id).failures == 1  # counted once
    finally:
        svc.stop()
        inner.close()


def test_an_agent_keeps_an_exit_as_running_until_it_is_acknowledged(tmp_path: Path) -> None:
    agent = Agent("127.0.0.1:1", "n1", FakeBackend("1xA100-80GB@4", node="n1"),
                  tmp_path / "work")
    outbox: queue.Queue[pb.AgentMessage | None] = queue.Queue()
    exit_msg = pb.AgentMessage(exited=pb.TrialExited(trial_id="s-1-t00000", exit_code=0,
                                                     attempt=2))
    agent._send(outbox, exit_msg, 0)
    assert outbox.get_nowait() == exit_msg
    # Its heartbeats and registration list it, so the server neither requeues it nor
    # launches it elsewhere before the exit is committed.
    assert [(r.trial_id, r.attempt) for r in agent._running()] == [("s-1-t00000", 2)]
    agent._send_unacked(outbox, 0.0)  # a reconnection sends it again
    assert outbox.get_nowait() == exit_msg
    agent._command(pb.ServerMessage(acked=pb.Acked(id=ack_id(exit_msg) or "")), outbox)
    assert agent._running() == []
    agent._send_unacked(outbox, 0.0)
    assert outbox.empty()


def test_an_exit_listed_until_acknowledged_is_not_adopted_back() -> None:
    """The agent lists a trial whose exit awaits acknowledgement as running: a heartbeat
    in the batch that applies that exit must not adopt it back (found by the stateful
    test: an out-of-memory exit and such a heartbeat together put 95,000 MiB on an
    80 GiB GPU)."""
    store = MemoryStore()
    store.put_profile(Profile(key=WorkloadKey(model="resnet18", batch_size=512), arch="A100",
                              demand=Demand(compute_pct=70, memory_mib=38000, cores=1),
                              iter_time_s=0.1, iters_per_epoch=10))
    orch = Orchestrator(store, ManualClock(100.0), OrchestratorConfig())
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB@8").nodes[0]))
    sp = parse_space({"name": "t", "models": ["resnet18"],
                      "hyperparameters": {"batch_size": [512], "lr": [0.1, 0.2]},
                      "settings": {"fusion": "off", "oversubscription": {"A100": 2.0}}})
    a, b = (c.trial_id for c in launched(orch.handle(StudySubmitted(sp))))
    both = (RunningTrial(a, 0, attempt=1), RunningTrial(b, 0, attempt=1))
    result = orch.handle_batch([TrialOutOfMemory(a, "node0", attempt=1),
                                Heartbeat("node0", both)])
    assert result.refused == []
    assert orch.trial(a).state == TrialState.PENDING  # 57,000 MiB now: it waits for room
    assert orch.held("node0", 0)[1] <= 81920


def test_an_agent_ignores_acknowledgements_it_cannot_read(tmp_path: Path) -> None:
    agent = Agent("127.0.0.1:1", "n1", FakeBackend("1xA100-80GB@4", node="n1"),
                  tmp_path / "work")
    outbox: queue.Queue[pb.AgentMessage | None] = queue.Queue()
    before = agent.lease.until
    for bad in ("heartbeat:", "heartbeat:x", "heartbeat:-1", "heartbeat:" + "9" * 40,
                "exit:1:nobody", "", "\x00"):
        agent._command(pb.ServerMessage(acked=pb.Acked(id=bad)), outbox)
    assert agent.lease.until == before and outbox.empty()


# An exit's mark as handled (TrialRecord.exited) rides with the trial's change that the
# exit causes, whichever way the exit goes: the record changes once per exit, a repeat of
# the exit is stale, a heartbeat that still lists the attempt neither kills nor adopts it,
# and an exit whose handling is undone leaves no mark behind.


def _scored(retries: int = 2, objective: str = "loss") -> Any:
    return parse_space({"name": "t", "models": ["resnet18"],
                        "hyperparameters": {"batch_size": [64], "lr": [0.1, 0.2]},
                        "settings": {"fusion": "off", "retries": retries,
                                     "objective": {"metric": objective, "mode": "min"}}})


# Each way an exit goes: the event for trial `tid`'s attempt, the space, and the state
# the trial ends in.
EXITS: dict[str, tuple[Callable[[str, int], Any], Any, TrialState]] = {
    "completed": (lambda tid, a: TrialFinished(tid, "node0", {"loss": 0.5}, attempt=a),
                  _scored(), TrialState.COMPLETED),
    "diverged": (lambda tid, a: TrialFinished(tid, "node0", {}, attempt=a,
                                              nonfinite=("loss",)),
                 _scored(), TrialState.DIVERGED),
    "without its objective": (lambda tid, a: TrialFinished(tid, "node0", {"acc": 1.0},
                                                           attempt=a),
                              _scored(), TrialState.FAILED),
    "failed, runs again": (lambda tid, a: TrialFailed(tid, "node0", 1, "boom", attempt=a),
                           _scored(retries=2), TrialState.PENDING),
    "failed for good": (lambda tid, a: TrialFailed(tid, "node0", 1, "boom", attempt=a),
                        _scored(retries=0), TrialState.FAILED),
    "fenced": (lambda tid, a: TrialFailed(tid, "node0", 1, "", attempt=a, fenced=True),
               _scored(), TrialState.PENDING),
    "out of memory": (lambda tid, a: TrialOutOfMemory(tid, "node0", 2000, attempt=a),
                      _scored(), TrialState.PENDING),
}


@pytest.mark.parametrize("how", sorted(EXITS))
def test_an_exit_marks_its_attempt_in_the_change_it_causes(how: str) -> None:
    event_of, space, state = EXITS[how]
    orch = _orchestrator(ManualClock(100.0))
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
    orch = _orchestrator(ManualClock(100.0))
    t = launched(orch.handle(StudySubmitted(_scored())))[0]
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
    orch = _orchestrator(ManualClock(100.0))
    a, b = launched(orch.handle(StudySubmitted(_scored())))[:2]
    result = orch.handle_batch([
        TrialFinished(a.trial_id, "node0", {"loss": 0.5}, attempt=a.attempt),
        TrialFailed(b.trial_id, "node0", 1, "boom", attempt=b.attempt),
        TrialFinished(a.trial_id, "node0", {"loss": 0.5}, attempt=a.attempt),  # a copy
    ])
    assert len(result.stale) == 1 and result.stale[0].expected
    assert orch.trial(a.trial_id).exited == a.attempt
    assert orch.trial(b.trial_id).exited == b.attempt
    assert orch.trial(b.trial_id).failures == 1
