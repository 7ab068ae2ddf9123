"""A node cannot make the server grow: a rogue node's heartbeats list many trials the
server never gave it and it never reads its stream; the server's RSS stays within 2x of
its idle size and `status` stays fast (issue 35: 72 MB to 3.2 GB in 18 s before)."""

from __future__ import annotations

import pytest

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.server.intake import MAX_OUTBOX, MAX_RUNNING_PER_NODE, AgentSession
from hypersack.testing.rogue import run_rogue


@pytest.mark.parametrize("trials", [MAX_RUNNING_PER_NODE - 1, 100_000])
def test_a_rogue_heartbeat_keeps_the_server_small(trials: int) -> None:
    run = run_rogue(seconds=6.0, trials=trials)
    assert run.heartbeats >= 3  # each is 100,000 trials: four processes on two cores sent 4 in 6 s
    assert run.peak_ratio < 2.0, (run.idle_rss_mib, run.rss_mib)
    assert all(s < 5.0 for s in run.status_s), run.status_s  # a generous bound: CI shares cores


def test_an_agent_that_does_not_read_is_cut_off() -> None:
    cut: list[bool] = []
    session = AgentSession(node="n1", backend="fake", spec=None)  # type: ignore[arg-type]
    session.on_overflow = lambda: cut.append(True)
    kill = pb.ServerMessage(kill=pb.KillTrial(trial_id="t", attempt=1))
    assert session.send_kill(kill, now=0.0) and not session.send_kill(kill, now=1.0)
    assert session.send_kill(kill, now=11.0)  # coalesced for 10 s only
    for i in range(MAX_OUTBOX):
        session.send(pb.ServerMessage(acked=pb.Acked(id=str(i))))
    assert cut == [True] and session.overflowed and not session.connected
    assert session.drain() == [None]  # the queue is dropped; the stream ends
    session.send(kill)
    assert len(session.outbox) == 0 and cut == [True]
