"""Acknowledgements carried with the server's other messages (issue 37, 3): at a thousand
nodes an acknowledgement of its own was two of every five messages crossing the server's
stream loop. An agent that says Register.folded_acks gets them with whatever is written
to it next (an exit's, with its successor's launch), or alone in a message with no body,
which its heartbeats' `processed` does not count; an older agent gets Acked messages."""

from __future__ import annotations

import queue
from pathlib import Path

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent.agent import Agent
from hypersack.agent.devices import FakeBackend
from hypersack.core.types import NodeSpec
from hypersack.server.intake import MAX_OUTBOX, AgentSession
from hypersack.server.service import SchedulerService
from hypersack.testing.server import first_launch, one_a100, profiled_store, wait
from hypersack.wire.convert import ack_id

LRS = ", ".join(str(0.001 * (i + 1)) for i in range(60))
SPACE = ("name: many\nmodels: [resnet18]\nhyperparameters: {batch_size: [64], lr: ["
         + LRS + "]}\nsettings: {fusion: 'off', retries: 0}\nprogram: {builtin: sleep}\n")


def _session(folded: bool) -> AgentSession:
    return AgentSession(node="n0", backend="fake", spec=NodeSpec(name="n0", cores=8, gpus=()),
                        folded_acks=folded)


def _launch(trial_id: str) -> pb.ServerMessage:
    return pb.ServerMessage(launch=pb.LaunchTrial(trial_id=trial_id, gpu_index=0))


def test_acknowledgements_ride_with_the_next_message_or_go_alone() -> None:
    s = _session(folded=True)
    woken: list[int] = []
    s.on_send = lambda: woken.append(1)
    s.ack("exit:a:1", wake=False)
    assert woken == []  # the caller wakes the writer once it queued the batch's commands
    s.send(_launch("b"))
    s.ack("heartbeat:7")
    (msg,) = s.drain()
    assert msg is not None and msg.WhichOneof("body") == "launch"
    assert list(msg.acks) == ["exit:a:1", "heartbeat:7"]
    assert s.queued == 1  # only the launch counts among the messages the agent handles
    s.ack("heartbeat:8")
    (alone,) = s.drain()
    assert alone is not None and alone.WhichOneof("body") is None
    assert list(alone.acks) == ["heartbeat:8"]
    assert s.drain() == []  # each is sent once
    s.ack("heartbeat:9")
    s.close()
    out = s.drain()
    assert [m.WhichOneof("body") if m is not None else None for m in out] == [None, None]
    assert out[0] is not None and list(out[0].acks) == ["heartbeat:9"]  # before the end


def test_an_older_agent_gets_each_acknowledgement_as_a_message() -> None:
    s = _session(folded=False)
    s.ack("exit:a:1")
    s.send(_launch("b"))
    out = s.drain()
    assert [m.WhichOneof("body") for m in out if m is not None] == ["acked", "launch"]
    assert out[0] is not None and out[0].acked.id == "exit:a:1"
    assert all(not m.acks for m in out if m is not None)


def test_acknowledgements_waiting_are_bounded() -> None:
    s = _session(folded=True)
    for i in range(MAX_OUTBOX + 5):
        s.ack(f"heartbeat:{i}", wake=False)
    (msg,) = s.drain()
    assert msg is not None and len(msg.acks) == MAX_OUTBOX
    assert msg.acks[0] == "heartbeat:5"  # the oldest went: their reports are sent again


def test_an_exits_acknowledgement_rides_with_its_successors_launch(tmp_path: Path) -> None:
    store = profiled_store(tmp_path / "s.db")
    svc = SchedulerService(store, tick_interval_s=0.05)
    svc.start()
    try:
        session = svc.register(one_a100(folded_acks=True))
        svc.submit(SPACE, "many.yaml")
        launch = first_launch(session)  # drains the first decision's launches
        exit_msg = pb.AgentMessage(exited=pb.TrialExited(
            trial_id=launch.trial_id, exit_code=0, attempt=launch.attempt))
        svc.agent_message(session, exit_msg)
        got: list[pb.ServerMessage] = []

        def drained() -> bool:
            with svc.locked():  # never between a batch's acknowledgements and commands
                got.extend(m for m in session.drain() if m is not None)
            return bool(got)

        wait(drained)
        # One message: the successor's launch, carrying the exit's acknowledgement.
        assert [m.WhichOneof("body") for m in got] == ["launch"]
        assert list(got[0].acks) == [ack_id(exit_msg)]
        assert got[0].launch.trial_id != launch.trial_id
        # A heartbeat's acknowledgement, on receipt: carried, never an Acked message.
        svc.agent_message(session, pb.AgentMessage(heartbeat=pb.Heartbeat(seq=3)))
        later = [m for m in session.drain() if m is not None]
        assert [a for m in later for a in m.acks] == ["heartbeat:3"]
        assert not any(m.HasField("acked") for m in later)
    finally:
        svc.stop()
        store.close()


def test_an_agent_reads_acknowledgements_carried_with_a_command(tmp_path: Path) -> None:
    agent = Agent("127.0.0.1:1", "n1", FakeBackend("1xA100-80GB@4", node="n1"),
                  tmp_path / "work")
    assert agent._register().register.folded_acks
    outbox: queue.Queue[pb.AgentMessage | None] = queue.Queue()
    exit_msg = pb.AgentMessage(exited=pb.TrialExited(trial_id="s-1-t00000", exit_code=0,
                                                     attempt=1))
    agent._send(outbox, exit_msg, 0)
    beat = agent._heartbeat()
    sent = agent._beats.sent_at(beat.heartbeat.seq)
    before = agent._processed
    both = pb.ServerMessage(acks=[ack_id(exit_msg) or "", f"heartbeat:{beat.heartbeat.seq}"])
    # As the stream reads it: the heartbeat's acknowledgement renews the lease at once,
    # before (and whatever) the command thread does; the exit's waits for that thread.
    agent._heard(both)
    assert agent.lease.until == sent + agent.fence_s  # the lease runs from that heartbeat
    assert agent._running() != []
    agent._command(both, outbox)
    assert agent._running() == []  # the exit is no longer kept to send again
    assert agent._processed == before  # acknowledgements alone: not a message handled
    agent._command(pb.ServerMessage(
        kill=pb.KillTrial(trial_id="nothing", attempt=1), acks=["heartbeat:999"]), outbox)
    assert agent._processed == before + 1  # a command, whatever it carries
