"""The floor under the control plane's CPU per trial: the same agents and the same
messages as `bench_control_plane.py`, against a bare gRPC server that only answers.

The bare server is HyperSack's agent stream with nothing behind it: one grpc.aio
servicer, every stream served on one event loop as the real server serves them (a
reader task per stream, an async generator writing what is queued), no event worker, no
orchestrator, no store. Each agent's GPUs are given `--per-gpu` trials at once (the
real server's first decision at 1,000 x 8 places six on each); each exit is
acknowledged, folded into the next trial's launch on that GPU while trials are left,
else in a message of its own; each heartbeat is acknowledged. So per trial it reads
and writes what the real server does, built as the real server builds it
(`intake.launch_pb`). Its CPU per trial, from the first launch to the last exit, is
what Python's gRPC and protobuf cost on this machine before HyperSack does anything.
The server is pinned to one core and the agents to the other, as in
`bench_control_plane.py` (same workers: `bench_control_plane.py --worker`).

    python scripts/bench_grpc_floor.py                        # 1,000 x 8, 50,000 trials
    python scripts/bench_grpc_floor.py --agents 200 --gpus 4 --trials 10000 --max-s 12
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypersack._proto.v1 import hypersack_pb2 as pb  # noqa: E402
from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc  # noqa: E402
from hypersack.core.types import Demand, WorkloadKey  # noqa: E402
from hypersack.grid.space import Program  # noqa: E402
from hypersack.orchestrator.commands import LaunchTrial  # noqa: E402
from hypersack.server.intake import batched, launch_pb  # noqa: E402
from hypersack.wire.convert import ack_id, heartbeat_ack  # noqa: E402


class Bare(pb_grpc.AgentLinkServicer):  # type: ignore[misc]
    """Answers agents: launches while trials are left, acknowledgements always."""

    def __init__(self, agents: int, trials: int, per_gpu: int, ack_delay_s: float = 0.0,
                 before: bool = False) -> None:
        self.agents, self.left, self.per_gpu = agents, trials, per_gpu
        self.ack_delay_s = ack_delay_s
        self.before = before  # each acknowledgement and launch its own message
        self.trials = trials
        self.registered: list[tuple[deque[pb.ServerMessage], asyncio.Event, int]] = []
        self.where: dict[str, int] = {}  # trial -> its GPU
        self.exits = 0
        self.began_cpu = 0.0
        self.began = 0.0
        self.done = asyncio.Event()
        self.seq = 0

    def _launch(self, gpu: int, acks: list[str]) -> pb.ServerMessage:
        self.seq += 1
        self.left -= 1
        tid = f"load-{self.seq:06d}-a1b2c3d4"
        c = LaunchTrial(trial_id=tid, study_id="load-0001", node="", gpu_index=gpu,
                        params={"batch_size": 128, "lr": 1.234567e-3},
                        key=WorkloadKey(model="resnet18", batch_size=128), epochs=1.0,
                        demand=Demand(compute_pct=45.0, memory_mib=9000, cores=1),
                        attempt=1, owner="local", program=Program(builtin="sleep"))
        self.where[tid] = gpu
        return pb.ServerMessage(launch=launch_pb(c), acks=acks)

    def _start(self) -> None:
        self.began_cpu = time.process_time()
        self.began = time.monotonic()
        for outbox, wake, gpus in self.registered:
            for _ in range(self.per_gpu):
                for gpu in range(gpus):
                    if self.left > 0:
                        outbox.append(self._launch(gpu, []))
            wake.set()

    async def Connect(self, requests: AsyncIterator[pb.AgentMessage],
                      context: Any) -> AsyncIterator[pb.ServerMessage]:
        first = await anext(aiter(requests))
        outbox: deque[pb.ServerMessage] = deque([pb.ServerMessage(
            registered=pb.Registered())])
        wake = asyncio.Event()
        loop = asyncio.get_running_loop()
        self.registered.append((outbox, wake, len(first.register.gpus)))
        if len(self.registered) == self.agents:
            loop.call_later(0.5, self._start)

        # Acknowledgements not yet written: each goes with the next message written to
        # the stream, or alone (AgentSession.drain); an exit's waits for it (held).
        acks: list[str] = []

        def acknowledge(ack: str, held: bool = False) -> None:
            if self.ack_delay_s > 0:
                if not acks:
                    loop.call_later(self.ack_delay_s, wake.set)
                acks.append(ack)
                return
            acks.append(ack)
            if not (held and not self.before):
                wake.set()

        async def read() -> None:
            async for msg in requests:
                kind = msg.WhichOneof("body")
                if kind == "heartbeat":  # as the server: on receipt, and at once
                    acks.append(heartbeat_ack(msg.heartbeat.seq))
                    wake.set()
                    continue
                ack = ack_id(msg)
                if kind == "exited":
                    self.exits += 1
                    gpu = self.where.pop(msg.exited.trial_id, 0)
                    if self.left > 0:
                        outbox.append(self._launch(gpu, [*([ack] if ack else [])]))
                        wake.set()
                    elif ack is not None:
                        acknowledge(ack, held=True)
                    if self.exits == self.trials:
                        self.done.set()
                elif ack is not None:
                    acknowledge(ack)

        reader = asyncio.create_task(read())
        try:
            while True:
                wake.clear()
                out: list[pb.ServerMessage | None] = list(outbox)
                outbox.clear()
                if acks and (self.ack_delay_s <= 0 or not out or self.before):
                    if out and out[0] is not None:
                        out[0].acks.extend(acks)
                    else:
                        out.insert(0, pb.ServerMessage(acks=acks[:]))
                    acks.clear()
                for m in (out if self.before else batched(out)):
                    assert m is not None
                    yield m
                if reader.done():
                    return
                await wake.wait()
        finally:
            reader.cancel()


async def _serve(args: argparse.Namespace) -> None:
    server = grpc.aio.server(options=[("grpc.max_concurrent_streams", 100_000)])
    bare = Bare(args.agents, args.trials, args.per_gpu, args.ack_delay_ms / 1000,
                args.before)
    pb_grpc.add_AgentLinkServicer_to_server(bare, server)
    server.add_insecure_port(args.listen)
    await server.start()
    print("listening", flush=True)
    await bare.done.wait()
    cpu = time.process_time() - bare.began_cpu
    wall = time.monotonic() - bare.began
    print(json.dumps({"cpu_s": round(cpu, 2), "wall_s": round(wall, 1),
                      "exits": bare.exits}), flush=True)
    await asyncio.Event().wait()  # until terminated: the agents' streams stay open


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8, help="GPUs per agent")
    ap.add_argument("--trials", type=int, default=50_000)
    ap.add_argument("--per-gpu", type=int, default=6, help="trials a GPU is given at once")
    ap.add_argument("--min-s", type=float, default=4.0)
    ap.add_argument("--max-s", type=float, default=60.0)
    ap.add_argument("--heartbeat-s", type=float, default=5.0)
    ap.add_argument("--agent-procs", type=int, default=4)
    ap.add_argument("--ack-delay-ms", type=float, default=0.0,
                    help="acknowledgements that no launch carries wait up to this long, "
                         "gathered into one message per stream (0: each goes at once)")
    ap.add_argument("--before", action="store_true",
                    help="as before 2026-11-28: every acknowledgement no launch carries and "
                         "every launch a message of its own (now: an exit's waits for the "
                         "next message, a heartbeat's at last, and what is queued for a "
                         "stream is written as one, as the server does with agents that "
                         "say Register.held_acks and batched)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--listen", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    for name in ("agents", "gpus", "trials", "per_gpu", "agent_procs"):
        if not 1 <= getattr(args, name) <= 1_000_000:
            ap.error(f"--{name.replace('_', '-')} must lie in [1, 1000000]")
    if args.agent_procs > args.agents:
        ap.error("--agent-procs must not exceed --agents")
    if not 0 < args.min_s <= args.max_s <= 86_400:
        ap.error("--min-s and --max-s: 0 < min <= max <= 86400")
    if not 0 < args.heartbeat_s <= 3600:
        ap.error("--heartbeat-s must lie in (0, 3600]")
    if not 0 <= args.ack_delay_ms <= 10_000:
        ap.error("--ack-delay-ms must lie in [0, 10000]")
    if args.serve:
        asyncio.run(_serve(args))
        return 0
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_control_plane import _free_port

    address = f"127.0.0.1:{_free_port()}"
    cpus = sorted(os.sched_getaffinity(0))
    pinned = len(cpus) >= 2 and shutil.which("taskset") is not None
    if pinned:
        os.sched_setaffinity(0, cpus[1:])
    prefix = ["taskset", "-c", str(cpus[0])] if pinned else []
    server = subprocess.Popen(
        [*prefix, sys.executable, __file__, "--serve", "--listen", address,
         "--agents", str(args.agents), "--trials", str(args.trials),
         "--per-gpu", str(args.per_gpu), "--ack-delay-ms", str(args.ack_delay_ms),
         *(["--before"] if args.before else [])],
        stdout=subprocess.PIPE, text=True)
    assert server.stdout is not None
    if server.stdout.readline().strip() != "listening":
        raise RuntimeError("the bare server did not start")
    tmp = Path(tempfile.mkdtemp(prefix="hs-floor-"))
    cuts = [args.agents * k // args.agent_procs for k in range(args.agent_procs + 1)]
    workers = [subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "bench_control_plane.py"), "--worker",
         "--first", str(cuts[k]), "--agents", str(cuts[k + 1] - cuts[k]),
         "--gpus", str(args.gpus), "--address", address, "--min-s", str(args.min_s),
         "--max-s", str(args.max_s), "--heartbeat-s", str(args.heartbeat_s),
         "--no-pending", str(tmp / "never"),
         *(["--acks", "folded", "--unbatched"] if args.before else [])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for k in range(args.agent_procs)]
    try:
        for w in workers:
            assert w.stdout is not None
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError("an agent worker did not start")
        got = json.loads(server.stdout.readline())
        rss = psutil.Process(server.pid).memory_info().rss
    finally:
        for w in workers:
            try:
                w.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                w.kill()
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"agents": args.agents, "gpus": args.agents * args.gpus,
              "trials": args.trials, "heartbeats": f"every {args.heartbeat_s:g} s",
              "pinned": f"server on CPU {cpus[0]}, agents on the others" if pinned else "no",
              "messages": "as before 2026-11-28" if args.before else "held and batched",
              "study_wall_s": got["wall_s"], "exits": got["exits"],
              "server_rss_mib": round(rss / 2**20, 1),
              "bare_server_cpu_ms_per_trial": round(1000 * got["cpu_s"] / args.trials, 3)}
    for k, v in result.items():
        print(f"{k:>30}: {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
