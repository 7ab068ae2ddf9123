"""A trial cannot make its agent talk too much: what the agent keeps and sends of a
trial's metrics is bounded below the server's limits, what is dropped is counted in the
trial's exit, a message over the size the server takes is never sent (nor sent again),
and a report the server never takes is dropped after a bounded number of tries."""

from __future__ import annotations

import json
import queue
import sys
from pathlib import Path

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.agent.acks import MAX_SEND_BYTES
from hypersack.agent.agent import Agent
from hypersack.agent.devices import FakeBackend
from hypersack.agent.launcher import Job
from hypersack.agent.ledger import MAX_REPORT_TRIES
from hypersack.wire.convert import LOG_TAIL_CHARS, MAX_METRICS


def job(tmp_path: Path) -> Job:
    j = Job("s-1-t00000", 0, tmp_path / "t", [sys.executable, "-c", "pass"], {}, base_env={})
    j.workdir.mkdir(parents=True)
    j.channel_dir.mkdir()
    return j


def write(j: Job, *records: object) -> None:
    with open(j.metrics_path, "a") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


def test_a_metrics_line_of_300000_names_is_dropped_and_counted(tmp_path: Path) -> None:
    j = job(tmp_path)
    write(j, {"step": 1, "metrics": {f"m{i:06d}": 1.0 for i in range(300_000)}})
    while j.new_metrics():  # read a bounded part per call, as the agent polls
        pass
    for _ in range(20):
        j.new_metrics()
    write(j, {"step": 2, "metrics": {"loss": 0.5}})
    assert j.new_metrics() and j.metrics == {"loss": 0.5} and j.step == 2
    assert j.dropped == {"metrics lines over 64 KiB": 1}
    tail = j.exit_tail(LOG_TAIL_CHARS)
    assert tail.startswith("[hypersack: the agent dropped 1 metrics lines over 64 KiB]")
    exited = pb.AgentMessage(exited=pb.TrialExited(trial_id=j.id, log_tail=tail,
                                                   metrics=j.metrics))
    assert exited.ByteSize() < 64 << 10


def test_metric_names_are_bounded_in_number_and_length(tmp_path: Path) -> None:
    j = job(tmp_path)
    write(j, {"step": 1, "metrics": {f"m{i}": float(i) for i in range(1000)}},
          {"metrics": {"x" * 65: 1.0, "m0": 7.0}}, {"metrics": {"a": 1.0}},
          {"metrics": {"m1": 10 ** 400}}, {"metrics": {"m2": "oops"}}, "not a record")
    assert j.new_metrics()
    assert len(j.metrics) == MAX_METRICS and j.metrics["m0"] == 7.0
    assert j.dropped == {f"metric names beyond the first {MAX_METRICS}": 1000 - MAX_METRICS + 1,
                         "metric names over 64 characters": 1,
                         "malformed metrics lines": 3}


def test_an_oversized_message_is_dropped_once_and_never_sent_again(tmp_path: Path) -> None:
    a = Agent("127.0.0.1:1", "n1", FakeBackend("1xA100-80GB@4", node="n1"), tmp_path / "w")
    outbox: queue.Queue[pb.AgentMessage | None] = queue.Queue()
    big = pb.AgentMessage(exited=pb.TrialExited(trial_id="t", attempt=1,
                                                log_tail="x" * (MAX_SEND_BYTES + 1)))
    small = pb.AgentMessage(exited=pb.TrialExited(trial_id="u", attempt=1))
    a._send(outbox, big, 0)
    a._send(outbox, small, 0)
    outbox.put(None)
    sent = list(a._sized(outbox))
    assert sent == [small]  # the stream goes on with the rest
    assert list(a._unacked) == ["exit:1:u"]  # and the big one is not kept to resend


def test_a_report_never_acknowledged_is_dropped_after_bounded_tries(tmp_path: Path) -> None:
    a = Agent("127.0.0.1:1", "n1", FakeBackend("1xA100-80GB@4", node="n1"), tmp_path / "w")
    outbox: queue.Queue[pb.AgentMessage | None] = queue.Queue()
    a._send(outbox, pb.AgentMessage(exited=pb.TrialExited(trial_id="t", attempt=1)), 0)
    for _ in range(MAX_REPORT_TRIES + 5):
        a._send_unacked(outbox, 0.0)
    assert outbox.qsize() == MAX_REPORT_TRIES and not a._unacked
