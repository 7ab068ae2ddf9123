"""Fewer messages through the server's stream loop (issue 37, 3), which each cost it
about the same whatever their size. An agent that says Register.held_acks lets a
report's acknowledgement wait for the next message written to it (its next heartbeat's
acknowledgement at the latest) instead of one written for it alone, and sends a report
again only after two heartbeat intervals; one that says Register.batched reads the
messages queued for it written as one (ServerMessage.more), each handled and counted as
if it had come alone."""

from __future__ import annotations

import logging
import queue
import sys
import types
from pathlib import Path

import pytest

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent import acks as agent_acks
from hypersack.agent import ledger
from hypersack.agent.acks import unbatched
from hypersack.agent.agent import Agent
from hypersack.agent.devices import FakeBackend
from hypersack.agent.launcher import Job, job_key
from hypersack.core.types import NodeSpec
from hypersack.orchestrator.events import RunningTrial
from hypersack.server.intake import (
    MAX_BATCH,
    MAX_BATCH_BYTES,
    MAX_HELD_ACKS,
    AgentSession,
    Intake,
)
from hypersack.server.service import SchedulerService
from hypersack.testing.server import one_a100, profiled_store, wait
from hypersack.wire.convert import ack_id

SPACE = ("name: two\nmodels: [resnet18]\nhyperparameters: {batch_size: [64], lr: [0.001, "
         "0.002]}\nsettings: {fusion: 'off', retries: 0}\nprogram: {builtin: sleep}\n")


def _session(held: bool = False, batched: bool = False) -> AgentSession:
    return AgentSession(node="n0", backend="fake", spec=NodeSpec(name="n0", cores=8, gpus=()),
                        folded_acks=True, held_acks=held, batched=batched)


def _launch(trial_id: str, params: str = "{}") -> pb.ServerMessage:
    return pb.ServerMessage(launch=pb.LaunchTrial(trial_id=trial_id, gpu_index=0,
                                                  params_json=params))


def _exit(trial_id: str) -> pb.AgentMessage:
    return pb.AgentMessage(exited=pb.TrialExited(trial_id=trial_id, attempt=1))


def test_a_held_reports_acknowledgement_waits_for_the_next_message() -> None:
    held, plain = _session(held=True), _session()
    for s in (held, plain):
        woken: list[AgentSession] = []
        Intake.acknowledge([(s, _exit("a"), 0.0)], woken)
        assert woken == ([] if s is held else [s])
        assert s.acks == ["exit:1:a"]
    assert held.wants_wake("heartbeat:4") and plain.wants_wake("exit:1:a")
    # Its next heartbeat's acknowledgement wakes the writer, and carries it along.
    calls: list[int] = []
    held.on_send = lambda: calls.append(1)
    Intake().put(held, pb.AgentMessage(heartbeat=pb.Heartbeat(seq=4)))
    assert calls == [1]
    (msg,) = held.drain()
    assert msg is not None and list(msg.acks) == ["exit:1:a", "heartbeat:4"]
    # An agent whose heartbeats never come (or that floods reports) gets them once
    # MAX_HELD_ACKS wait: the server never keeps more for it.
    flood: list[AgentSession] = []
    Intake.acknowledge([(held, _exit(f"f{i}"), 0.0) for i in range(MAX_HELD_ACKS + 1)],
                       flood)
    assert flood == [held]
    assert len(held.drain()[0].acks) == MAX_HELD_ACKS + 1  # type: ignore[union-attr]


def test_queued_messages_go_as_one_to_an_agent_that_reads_them() -> None:
    s = _session(batched=True)
    for i in range(5):
        s.send(_launch(f"t{i}"), (RunningTrial(f"t{i}", 0),))
    s.ack("exit:1:old")
    s.close()
    out = s.drain()
    assert len(out) == 2 and out[1] is None  # the stream's end keeps its place
    head = out[0]
    assert head is not None and list(head.acks) == ["exit:1:old"]
    got = unbatched(head)
    assert [m.launch.trial_id for m in got] == [f"t{i}" for i in range(5)]
    assert all(not m.more for m in got)
    # The agent counts each as one message handled: after three, two are on their way.
    assert [r.trial_id for r in s.on_the_way(3, ())] == ["t3", "t4"]
    # An agent that does not read them gets each alone.
    plain = _session()
    for i in range(3):
        plain.send(_launch(f"t{i}"))
    assert len(plain.drain()) == 3


def test_a_batch_is_bounded_by_count_and_bytes() -> None:
    s = _session(batched=True)
    for i in range(MAX_BATCH + 3):
        s.send(_launch(f"t{i}"))
    assert [1 + len(m.more) for m in s.drain() if m is not None] == [MAX_BATCH, 3]
    big = '{"x": "' + "y" * (MAX_BATCH_BYTES // 3) + '"}'
    for i in range(5):
        s.send(_launch(f"b{i}", big))
    out = [m for m in s.drain() if m is not None]
    assert [1 + len(m.more) for m in out] == [2, 2, 1]
    assert all(m.ByteSize() <= MAX_BATCH_BYTES + 200 for m in out)
    assert [x.launch.trial_id for m in out for x in unbatched(m)] == \
        [f"b{i}" for i in range(5)]


def test_unbatched_reads_in_order_never_deeper_and_at_most_max_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    inner = _launch("b")
    inner.more.append(_launch("deeper"))  # the server never nests; a forged one is cut
    msg = _launch("a")
    msg.more.extend([inner, _launch("c")])
    got = unbatched(msg)
    assert [m.launch.trial_id for m in got] == ["a", "b", "c"]
    assert all(not m.more for m in got)
    assert unbatched(_launch("z"))[0].launch.trial_id == "z"
    monkeypatch.setattr(agent_acks, "MAX_MORE", 2)
    many = _launch("0")
    many.more.extend(_launch(str(i)) for i in range(1, 6))
    assert [m.launch.trial_id for m in unbatched(many)] == ["0", "1", "2"]


def test_an_agent_sends_a_report_again_only_after_two_heartbeats(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(ledger, "time", types.SimpleNamespace(monotonic=lambda: now[0]))
    agent = Agent("127.0.0.1:1", "n1", FakeBackend("1xA100-80GB@4", node="n1"),
                  tmp_path / "work")
    register = agent._register().register
    assert register.held_acks and register.batched
    agent.heartbeat_interval_s = 5.0
    outbox: queue.Queue[pb.AgentMessage | None] = queue.Queue()
    agent._send(outbox, _exit("s-1-t00000"), 0)
    assert outbox.get_nowait().HasField("exited")
    now[0] += 9.0  # past the agent's own 2 s, not past two heartbeats
    agent._send_unacked(outbox, agent.resend_s)
    assert outbox.empty()
    now[0] += 1.5
    agent._send_unacked(outbox, agent.resend_s)
    assert outbox.get_nowait().exited.trial_id == "s-1-t00000"
    agent.heartbeat_interval_s = 0.5  # short heartbeats: the agent's own interval rules
    now[0] += 2.0
    agent._send_unacked(outbox, agent.resend_s)
    assert outbox.get_nowait().HasField("exited")
    agent.heartbeat_interval_s = 3600.0  # an hour apart: sent again after a minute
    now[0] += 59.0
    agent._send_unacked(outbox, agent.resend_s)
    assert outbox.empty()
    now[0] += 1.5
    agent._send_unacked(outbox, agent.resend_s)
    assert outbox.get_nowait().HasField("exited")
    # Each message of a batch counts once handled, as it would alone.
    before = agent._processed
    kills = pb.ServerMessage(kill=pb.KillTrial(trial_id="none", attempt=1))
    kills.more.extend([pb.ServerMessage(kill=pb.KillTrial(trial_id="n2", attempt=1))] * 2)
    for m in unbatched(kills):
        agent._command(m, outbox)
    assert agent._processed == before + 3


def test_with_nothing_pending_an_exits_acknowledgement_waits_for_the_heartbeat(
        tmp_path: Path) -> None:
    store = profiled_store(tmp_path / "s.db")
    svc = SchedulerService(store, tick_interval_s=0.05)
    svc.start()
    try:
        session = svc.register(one_a100(folded_acks=True, held_acks=True, batched=True))
        woken: list[int] = []
        session.on_send = lambda: woken.append(1)
        svc.submit(SPACE, "two.yaml")
        wait(lambda: woken)
        with svc.locked():
            out = session.drain()
        assert len(out) == 1 and out[0] is not None  # one message
        got = unbatched(out[0])  # its registration's answer, then both launches
        assert [m.WhichOneof("body") for m in got] == ["registered", "launch", "launch"]
        launches = [m.launch for m in got[1:]]
        assert sorted(m.trial_id for m in launches) == sorted(
            t.id for t in store.list_trials(launches[0].study_id))
        woken.clear()
        exit_msg = pb.AgentMessage(exited=pb.TrialExited(
            trial_id=launches[0].trial_id, exit_code=0, attempt=launches[0].attempt))
        svc.agent_message(session, exit_msg)
        wait(lambda: session.acks)  # committed, acknowledged, and held: nothing written
        assert woken == [] and len(session.outbox) == 0
        svc.agent_message(session, pb.AgentMessage(heartbeat=pb.Heartbeat(
            seq=9, running=[pb.RunningTrial(trial_id=launches[1].trial_id, attempt=1)])))
        assert woken
        with svc.locked():
            (msg,) = session.drain()
        assert msg is not None and msg.WhichOneof("body") is None
        assert list(msg.acks) == [ack_id(exit_msg), "heartbeat:9"]
    finally:
        svc.stop()
        store.close()


def test_a_kill_for_an_attempt_that_ended_does_nothing(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A trial that failed and runs again elsewhere within a heartbeat is still listed by
    its first node while its exit waits for the acknowledgement: the server sends a
    kill for that attempt, which the agent finds ended and leaves alone."""
    agent = Agent("127.0.0.1:1", "n1", FakeBackend("1xA100-80GB@4", node="n1"),
                  tmp_path / "work")
    ended = Job("s-1-t00000", 0, tmp_path / "t", [sys.executable, "-c", "pass"], {},
                attempt=1)
    ended.exit_code = 1
    agent.jobs[job_key("s-1-t00000", 1)] = ended
    outbox: queue.Queue[pb.AgentMessage | None] = queue.Queue()
    with caplog.at_level(logging.INFO, logger="hypersack.agent.agent"):
        agent._command(pb.ServerMessage(kill=pb.KillTrial(
            trial_id="s-1-t00000", attempt=1, reason="attempt 1 was superseded")), outbox)
    assert ended.killed_at is None and ended.exit_code == 1
    assert "killing" not in caplog.text
