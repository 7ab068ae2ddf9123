"""A rogue node against a real server process: it registers, then sends heartbeats that
list many trials the server never gave it, and never reads what the server sends back.
Measures the server's resident memory and how long `status` (ListStudies) takes meanwhile.
Used by tests/integration/test_rogue_node.py and scripts/rogue_node.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import psutil

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc
from hypersack.testing.cluster import free_port, wait_for


@dataclass
class RogueRun:
    idle_rss_mib: float
    rss_mib: list[float] = field(default_factory=list)  # sampled while the node misbehaves
    status_s: list[float] = field(default_factory=list)  # ListStudies round trips
    heartbeats: int = 0
    stream_ended: str = ""  # how the server ended the rogue's stream ("" if it did not)

    @property
    def peak_ratio(self) -> float:
        return max(self.rss_mib, default=self.idle_rss_mib) / self.idle_rss_mib


def _heartbeat(seq: int, n: int) -> pb.AgentMessage:
    return pb.AgentMessage(heartbeat=pb.Heartbeat(seq=seq, running=[
        pb.RunningTrial(trial_id=f"ghost-{seq % 7}-{i:06d}", gpu_index=0, attempt=1)
        for i in range(n)]))


def run_rogue(seconds: float = 15.0, trials: int = 100_000, every_s: float = 0.5,
              workdir: Path | None = None) -> RogueRun:
    """Start a server, let it settle, then be the rogue node for `seconds`."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(workdir or tmp)
        port = free_port()
        address = f"127.0.0.1:{port}"
        log = open(root / "server.log", "wb")
        server = subprocess.Popen(
            [sys.executable, "-m", "hypersack.server.app", "--listen", address, "--db",
             str(root / "rogue.db"), "--heartbeat-interval-s", "0.5",
             "--heartbeat-timeout-s", "30"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return _against(server, address, seconds, trials, every_s)
        finally:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            log.close()


def _against(server: subprocess.Popen[bytes], address: str, seconds: float, trials: int,
             every_s: float) -> RogueRun:
    channel = grpc.insecure_channel(address, options=[
        ("grpc.max_send_message_length", 64 << 20)])
    scheduler = pb_grpc.SchedulerStub(channel)  # type: ignore[no-untyped-call]

    def serving() -> bool:
        try:
            scheduler.ListStudies(pb.ListStudiesRequest(), timeout=1)
            return True
        except grpc.RpcError:
            return False

    wait_for("the server to serve", serving, 60)
    proc = psutil.Process(server.pid)
    time.sleep(1.0)
    run = RogueRun(idle_rss_mib=proc.memory_info().rss / 2**20)
    up: list[pb.AgentMessage] = [pb.AgentMessage(register=pb.Register(
        node="rogue", cores=48, backend="fake",
        gpus=[pb.GpuInfo(index=0, arch="A100", memory_mib=81920, uuid="U0")]))]
    stop = threading.Event()
    sent = threading.Semaphore(0)

    def messages() -> Iterator[pb.AgentMessage]:
        yield up[0]
        seq = 0
        while not stop.is_set():
            seq += 1
            yield _heartbeat(seq, trials)
            sent.release()
            stop.wait(every_s)

    link = pb_grpc.AgentLinkStub(channel)  # type: ignore[no-untyped-call]
    call = link.Connect(messages())  # never read: the server's writes pile up
    ended = ""
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        t0 = time.monotonic()
        try:
            scheduler.ListStudies(pb.ListStudiesRequest(), timeout=30)
            run.status_s.append(time.monotonic() - t0)
        except grpc.RpcError as exc:
            run.status_s.append(float("inf"))
            ended = ended or f"status failed: {exc.code()}"
        run.rss_mib.append(proc.memory_info().rss / 2**20)
        if not ended and call.done():
            ended = str(call.code())
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))
    run.stream_ended = ended
    while sent.acquire(blocking=False):
        run.heartbeats += 1
    stop.set()
    call.cancel()
    channel.close()
    return run
