"""What one batch of the event worker applies: every report waiting, but at most
BEATS_PER_BATCH heartbeats (unless they waited a second), the latest per node. A
thousand agents' heartbeats arriving together held an exit behind them for hundreds of
milliseconds (issue 37, 3); now the exit is in the first batch."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.server.intake import BEATS_PER_BATCH
from hypersack.server.service import SchedulerService
from hypersack.store.sqlite import SqliteStore


def _queue(svc: SchedulerService, node: str, msg: pb.AgentMessage, at: float) -> None:
    svc.intake._inbox.put((SimpleNamespace(node=node), msg, at))  # type: ignore[arg-type]


def _beat(seq: int) -> pb.AgentMessage:
    return pb.AgentMessage(heartbeat=pb.Heartbeat(seq=seq))


def _kinds(batch: list[Any]) -> list[str]:
    return [m.WhichOneof("body") for _, m, _ in batch]


def test_an_exit_is_not_held_behind_a_thousand_heartbeats(tmp_path: Path) -> None:
    svc = SchedulerService(SqliteStore(tmp_path / "s.db"))
    now = time.monotonic()
    for seq in (1, 2):  # every node's heartbeat twice: only the newer counts
        for i in range(300):
            _queue(svc, f"n{i:03d}", _beat(seq), now)
    _queue(svc, "n007", pb.AgentMessage(exited=pb.TrialExited(trial_id="t1")), now)
    first = svc.intake.next_batch(wait_s=0)
    assert _kinds(first).count("exited") == 1
    # The exit's own node's heartbeat goes with it (its newer one came first: it was
    # sent before the exit was queued here), and the cap's worth of others.
    assert _kinds(first).count("heartbeat") <= BEATS_PER_BATCH + 1
    seen: dict[str, int] = {}
    batch = first
    while batch:
        for session, msg, _ in batch:
            if msg.WhichOneof("body") == "heartbeat":
                assert session.node not in seen  # one per node: coalesced
                seen[session.node] = msg.heartbeat.seq
        assert _kinds(batch).count("heartbeat") <= BEATS_PER_BATCH + 1
        batch = svc.intake.next_batch(wait_s=0)
    assert len(seen) == 300 and set(seen.values()) == {2}


def test_heartbeats_that_waited_a_second_all_go(tmp_path: Path) -> None:
    svc = SchedulerService(SqliteStore(tmp_path / "s.db"))
    old = time.monotonic() - 5.0
    for i in range(3 * BEATS_PER_BATCH):
        _queue(svc, f"n{i:03d}", _beat(1), old)
    # None may wait longer: a node is never taken for silent because of the cap.
    assert _kinds(svc.intake.next_batch(wait_s=0)).count("heartbeat") == 3 * BEATS_PER_BATCH
    assert svc.intake.next_batch(wait_s=0) == []


def test_a_node_s_messages_keep_their_order(tmp_path: Path) -> None:
    svc = SchedulerService(SqliteStore(tmp_path / "s.db"))
    now = time.monotonic()
    for i in range(3 * BEATS_PER_BATCH):  # others' heartbeats, queued first
        _queue(svc, f"n{i:03d}", _beat(1), now)
    _queue(svc, "late", _beat(1), now + 0.001)
    _queue(svc, "late", pb.AgentMessage(exited=pb.TrialExited(trial_id="t1")), now + 0.002)
    _queue(svc, "late", _beat(2), now + 0.003)  # sent after the exit: it waits
    first = svc.intake.next_batch(wait_s=0)
    mine = [(m.WhichOneof("body"), m.heartbeat.seq) for s, m, _ in first if s.node == "late"]
    # Its heartbeat 1 was replaced by 2, which is newer than the exit: the exit goes
    # alone, and 2 follows in a later batch.
    assert mine == [("exited", 0)]
    rest = []
    while batch := svc.intake.next_batch(wait_s=0):
        rest += [m.heartbeat.seq for s, m, _ in batch if s.node == "late"]
    assert rest == [2]
    # A heartbeat sent before a node's exit is applied before it, in the same batch.
    _queue(svc, "x", _beat(7), now + 1)
    for i in range(3 * BEATS_PER_BATCH):
        _queue(svc, f"m{i:03d}", _beat(1), now + 1)
    _queue(svc, "x", pb.AgentMessage(exited=pb.TrialExited(trial_id="t2")), now + 2)
    batch = svc.intake.next_batch(wait_s=0)
    assert [m.WhichOneof("body") for s, m, _ in batch if s.node == "x"] == \
        ["heartbeat", "exited"]



def _exit(tid: str) -> pb.AgentMessage:
    return pb.AgentMessage(exited=pb.TrialExited(trial_id=tid))


def test_under_load_a_batch_gathers_what_follows_and_idle_it_does_not_wait(
        tmp_path: Path) -> None:
    """Reports arriving within `gather_s` of each other are applied together (a batch
    costs a commit, a decision and a wake-up whatever its size); a report after a quiet
    spell is applied at once."""
    import threading

    svc = SchedulerService(SqliteStore(tmp_path / "s.db"), batch_gather_s=1.5)
    _queue(svc, "n1", _exit("t1"), time.monotonic())
    began = time.monotonic()
    assert _kinds(svc.intake.next_batch(wait_s=0)) == ["exited"]  # idle: at once
    assert time.monotonic() - began < 1.0
    # Busy: the next report came right after the last one; one more follows while the
    # batch gathers, and goes with it.
    _queue(svc, "n2", _exit("t2"), time.monotonic())
    later = threading.Timer(0.05, lambda: _queue(svc, "n3", _exit("t3"), time.monotonic()))
    later.start()
    try:
        batch = svc.intake.next_batch(wait_s=0)
    finally:
        later.join()
    assert [m.exited.trial_id for _, m, _ in batch] == ["t2", "t3"]
    # Off (0): what is queued, at once.
    svc.intake.gather_s = 0.0
    _queue(svc, "n4", _exit("t4"), time.monotonic())
    assert [m.exited.trial_id for _, m, _ in svc.intake.next_batch(wait_s=0)] == ["t4"]


def test_a_poke_ticks_at_once_and_the_ticker_wakes_for_what_waits_on_time(
        tmp_path: Path) -> None:
    """The ticker ticks when poked (a simulation's answer came) and when the
    orchestrator has something due sooner than the interval (`wake_at`), not only every
    `tick_interval_s`."""
    import time

    svc = SchedulerService(SqliteStore(tmp_path / "s.db"), tick_interval_s=3600)
    svc.start()
    try:
        time.sleep(0.2)
        before = svc.stats["batches"]
        svc.poke()
        deadline = time.monotonic() + 30
        while svc.stats["batches"] == before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert svc.stats["batches"] > before  # within seconds, not the hour
        # Something due in a moment: the ticker wakes for it by itself.
        due = [time.time() + 0.5]
        svc.orch.wake_at = lambda: due[0] if due else None  # type: ignore[method-assign]
        poked = svc.stats["batches"]
        svc.poke()  # the ticker learns the time at this tick
        deadline = time.monotonic() + 30
        while svc.stats["batches"] == poked and time.monotonic() < deadline:
            time.sleep(0.01)
        ticked = svc.stats["batches"]
        assert ticked > poked
        while svc.stats["batches"] == ticked and time.monotonic() < deadline:
            time.sleep(0.01)
        due.clear()
        assert svc.stats["batches"] > ticked  # the tick at `due`, not in an hour
    finally:
        svc.stop()


def test_an_older_agents_started_message_is_not_queued(tmp_path: Path) -> None:
    """Agents used to report each launch as started: a message a trial that changed
    nothing (the launch and the heartbeats say as much). An older agent's is dropped on
    receipt; its other messages are queued as before."""
    svc = SchedulerService(SqliteStore(tmp_path / "s.db"))
    session: Any = SimpleNamespace(node="n1", overflowed=False, connected=True)
    svc.intake.put(session, pb.AgentMessage(started=pb.TrialStarted(trial_id="t1")))
    svc.intake.put(session, pb.AgentMessage(exited=pb.TrialExited(trial_id="t1")))
    assert _kinds(svc.intake.next_batch(wait_s=0)) == ["exited"]
