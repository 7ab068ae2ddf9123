"""Control-plane load: N simulated agents on one hypersack-server, one big study.

The server runs as its own process (its memory is measured alone); the agents are
gRPC streams, each with fake GPUs, from `--agent-procs` worker processes (4; 0: from
this process), so the clients' own Python does not share a core's GIL with one another
or with the server. A launched trial "runs" for a random time, then its agent reports
the exit. Reported: decisions per second,
heartbeats handled per second, the delay from the latest exit reported on a GPU to the
next launch the agent receives for that GPU (agent-side, round trip included; counted
while trials are pending), and the server's peak RSS. A GPU whose freed capacity fits
no pending trial waits for more exits, which shows in the tail of that delay.

    python scripts/bench_control_plane.py                  # 200 agents, 10,000 trials
    python scripts/bench_control_plane.py --agents 20 --trials 1000 --min-s 1 --max-s 3
    python scripts/bench_control_plane.py --tls both       # plain, then TLS: the ratios
    python scripts/bench_control_plane.py --sweep 20,100,200   # p50/p99 per agent count

With `--tls on` the server runs secured as a cluster would: TLS for the client with an
admin's token, mutual TLS for each agent with its own node certificate. Every agent has
its own connection in both modes, so the two runs differ by TLS and authentication only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import grpc
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypersack._proto.v1 import hypersack_pb2 as pb  # noqa: E402
from hypersack._proto.v1 import hypersack_pb2_grpc as pb_grpc  # noqa: E402
from hypersack.agent.acks import unbatched  # noqa: E402
from hypersack.cli.client import Client  # noqa: E402
from hypersack.server.auth import LOCAL, Authenticator  # noqa: E402
from hypersack.server.bridge import watch_lag  # noqa: E402
from hypersack.store.sqlite import SqliteStore  # noqa: E402
from hypersack.wire import tls as _tls  # noqa: E402

SPACE = """
name: load
models: {models}
hyperparameters:
  batch_size: {batch_sizes}
  lr: {{distribution: loguniform, low: 1.0e-5, high: 1.0e-1}}
search: {{type: random, samples: {trials}, seed: 0}}
settings: {{epochs: 1, retries: 0, policy: wfd}}
program: {{builtin: sleep}}
"""


class SimAgent:
    """One agent's stream, served on its worker's event loop (grpc.aio): no thread per
    agent, so that a thousand of them in four processes on one core leave that core
    room to answer at once. A thread per stream (two with grpc's blocking client) made
    the agents' core the bottleneck at 1,000 agents, and the delays it measured its own
    queues."""

    def __init__(self, name: str, channel: grpc.aio.Channel, gpus: int, bench: Bench) -> None:
        self.name = name
        self.gpus = gpus
        self.bench = bench
        self.up: asyncio.Queue[pb.AgentMessage] = asyncio.Queue()
        # Trial -> (GPU, attempt): a launch's attempt, said in heartbeats and the exit as
        # agents say it (the server marks the attempt's exit as handled).
        self.running: dict[str, tuple[int, int]] = {}
        self.processed = 0  # the server's messages handled (said in heartbeats)
        self.beats = 0
        self.registered = asyncio.Event()
        self.up.put_nowait(pb.AgentMessage(register=pb.Register(
            node=name, cores=22 * gpus, backend="bench", folded_acks=bench.folded_acks,
            held_acks=bench.held_acks, batched=bench.batched,
            gpus=[pb.GpuInfo(index=i, arch="A100", memory_mib=81920, uuid=f"{name}-{i}")
                  for i in range(gpus)])))
        self.call = pb_grpc.AgentLinkStub(channel).Connect()
        self.tasks = [asyncio.ensure_future(self._write()), asyncio.ensure_future(self._read())]

    async def _write(self) -> None:
        try:
            while True:
                await self.call.write(await self.up.get())
        except (grpc.RpcError, asyncio.InvalidStateError):
            pass

    async def _read(self) -> None:
        try:
            async for batch in self.call:
                self.bench.received += 1
                for msg in unbatched(batch):
                    self.bench.acked(msg)
                    self._handle(msg)
                    if msg.WhichOneof("body") is not None:  # not acknowledgements alone
                        self.processed += 1  # once a launch is in `running`, as agents do
        except grpc.RpcError:
            pass

    def _handle(self, msg: pb.ServerMessage) -> None:
        kind = msg.WhichOneof("body")
        if kind == "registered":
            self.registered.set()
        elif kind == "launch":
            self.bench.launched(self, msg.launch)
        elif kind == "kill":
            self.running.pop(msg.kill.trial_id, None)
            self.bench.kills += 1

    def heartbeat(self) -> None:
        running = [pb.RunningTrial(trial_id=t, gpu_index=g, attempt=a)
                   for t, (g, a) in self.running.items()]
        self.beats += 1  # numbered, as an agent's are: the server acknowledges each
        self.up.put_nowait(pb.AgentMessage(heartbeat=pb.Heartbeat(
            running=running, seq=self.beats,
            processed=self.processed if self.bench.say_processed else 0)))
        self.bench.heartbeats_sent += 1

    def finish(self, trial_id: str, attempt: int) -> None:
        held = self.running.get(trial_id)
        if held is None or held[1] != attempt:  # killed meanwhile, or launched again
            self.bench.superseded += 1
            return
        del self.running[trial_id]
        gpu = held[0]
        self.bench.exited(self.name, gpu)
        self.bench.exits_sent[f"exit:{attempt}:{trial_id}"] = (time.monotonic(),
                                                                self.bench.pending_left)
        self.up.put_nowait(pb.AgentMessage(exited=pb.TrialExited(
            trial_id=trial_id, exit_code=0, metrics={"loss": 1.0}, attempt=attempt)))


class Bench:
    """What one worker's agents measured; everything runs on that worker's event loop."""

    def __init__(self, min_s: float, max_s: float, seed: int = 0) -> None:
        self.min_s, self.max_s = min_s, max_s
        self.kills = 0  # trials the server stopped (requeued: their node looked lost)
        # Heartbeats say how many server messages were handled (as agents do); false:
        # they do not, as agents before that did.
        self.say_processed = True
        self.folded_acks = True
        self.held_acks = True  # a report's acknowledgement may wait (Register.held_acks)
        self.batched = True  # reads several messages written as one (Register.batched)
        self.superseded = 0  # timers of trials no longer held when they fired
        self.rng = random.Random(seed)
        self.waiting: dict[tuple[str, int], float] = {}  # GPU -> when a trial on it exited
        self.delays: list[float] = []
        self.launches = 0
        self.heartbeats_sent = 0
        self.received = 0  # the server's messages the agents read
        # An exit's round trip: sent, to its acknowledgement read (the server's handling
        # and the transport both ways, whatever GPU the next launch goes to).
        self.exits_sent: dict[str, tuple[float, bool]] = {}
        self.ack_delays: list[float] = []
        self.ack_delays_pending: list[float] = []  # of exits while trials were pending
        self.pending_left = True

    def launched(self, agent: SimAgent, m: pb.LaunchTrial) -> None:
        now = time.monotonic()
        self.launches += 1
        t0 = self.waiting.pop((agent.name, m.gpu_index), None)
        if t0 is not None:
            self.delays.append(now - t0)
        agent.running[m.trial_id] = (m.gpu_index, m.attempt)
        asyncio.get_running_loop().call_later(self.rng.uniform(self.min_s, self.max_s),
                                              agent.finish, m.trial_id, m.attempt)

    def acked(self, msg: pb.ServerMessage) -> None:
        now = time.monotonic()
        for ack in [*msg.acks, *([msg.acked.id] if msg.HasField("acked") else [])]:
            sent = self.exits_sent.pop(ack, None)
            if sent is not None:
                self.ack_delays.append(now - sent[0])
                if sent[1]:
                    self.ack_delays_pending.append(now - sent[0])

    def exited(self, node: str, gpu: int) -> None:
        if self.pending_left:
            self.waiting[node, gpu] = time.monotonic()  # the latest exit on that GPU


def worker(args: argparse.Namespace) -> int:
    return asyncio.run(_worker(args))


async def _worker(args: argparse.Namespace) -> int:
    """Agents `--first` .. `--first + --agents - 1` in this process: prints "ready" once
    they are registered, heartbeats until stdin closes, then prints one JSON line with
    what it measured. Exits stop counting once the file `--no-pending` exists."""
    bench = Bench(args.min_s, args.max_s, seed=args.first)
    bench.say_processed = not args.no_processed
    bench.folded_acks = args.acks != "separate"
    bench.held_acks = args.acks == "held"
    bench.batched = not args.unbatched
    agents = []
    for i in range(args.first, args.first + args.agents):
        name = f"a{i:03d}"
        if args.certs:
            paths = _tls.leaf_paths(Path(args.certs), _tls.NODE, name)
            channel = grpc.aio.secure_channel(args.address, _tls.channel_credentials(
                Path(args.certs) / "ca.crt", paths.cert, paths.key))
        else:
            channel = grpc.aio.insecure_channel(args.address)
        agents.append(SimAgent(name, channel, args.gpus, bench))
    await asyncio.wait_for(asyncio.gather(*(a.registered.wait() for a in agents)), 120)
    print("ready", flush=True)
    flag = Path(args.no_pending)

    async def beat(phase: float, beating: list[SimAgent]) -> None:
        await asyncio.sleep(phase)
        while True:
            for a in beating:
                a.heartbeat()
            await asyncio.sleep(args.heartbeat_s)

    async def flagged() -> None:
        while not flag.exists():
            await asyncio.sleep(0.1)
        bench.pending_left = False

    # Each agent beats on its own timer, from its own phase in the interval, as agents
    # that registered at different times do (`--beats together`: all of this worker's
    # agents in one burst, every interval).
    rng = random.Random(args.first)
    timers = [beat(args.heartbeat_s, agents)] if args.beats == "together" else \
        [beat(rng.uniform(0, args.heartbeat_s), [a]) for a in agents]
    beating = asyncio.gather(*timers, flagged())
    # How late this worker's loop runs a timer: the delays above include it (a launch
    # read late is a launch timed late).
    lags: list[float] = []
    lagging = asyncio.ensure_future(watch_lag(lags.append))
    # Until the parent closes stdin.
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    beating.cancel()
    lagging.cancel()
    await asyncio.gather(beating, lagging, return_exceptions=True)
    print(json.dumps({"delays": bench.delays, "launches": bench.launches, "lags": lags,
                      "heartbeats": bench.heartbeats_sent, "kills": bench.kills,
                      "received": bench.received, "ack_delays": bench.ack_delays,
                      "ack_delays_pending": bench.ack_delays_pending,
                      "superseded": bench.superseded}), flush=True)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=200)
    ap.add_argument("--agent-procs", type=int, default=4,
                    help="worker processes the agents are split over (at least 1)")
    ap.add_argument("--sweep", default="",
                    help="agent counts to run one after another, e.g. 20,100,200 (trials "
                         "scale with them: --trials per 200 agents)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--address", default="", help=argparse.SUPPRESS)
    ap.add_argument("--certs", default="", help=argparse.SUPPRESS)
    ap.add_argument("--no-pending", default="", help=argparse.SUPPRESS)
    ap.add_argument("--gpus", type=int, default=4, help="GPUs per agent")
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--min-s", type=float, default=4.0, help="shortest simulated trial")
    ap.add_argument("--max-s", type=float, default=12.0, help="longest simulated trial")
    ap.add_argument("--heartbeat-s", type=float, default=1.0)
    ap.add_argument("--acks", choices=["held", "folded", "separate"], default="held",
                    help="the agents read acknowledgements carried with the server's other "
                         "messages and let a report's wait for the next one (held, as agents "
                         "do), or not wait (folded, as agents before 2026-11-28), or get "
                         "each in a message of its own (separate, as older agents)")
    ap.add_argument("--unbatched", action="store_true",
                    help="the agents do not read several messages written as one (as "
                         "agents before 2026-11-28): every launch is a message")
    ap.add_argument("--beats", choices=["spread", "together"], default="spread",
                    help="each agent's heartbeats from its own phase in the interval (as "
                         "agents that registered at different times), or all of a worker "
                         "process's agents in one burst every interval")
    ap.add_argument("--no-processed", action="store_true",
                    help="agents do not say in heartbeats how many messages they handled "
                         "(as before: a launch still on its way counts as missing)")
    ap.add_argument("--mixed", action="store_true",
                    help="24 workloads of SP1 instead of one: freed capacity then often "
                         "fits no pending trial at once, which the relaunch delay includes")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--switch-ms", type=float, default=0.0,
                    help="the server's thread switch interval (sys.setswitchinterval), ms; "
                         "0: the server's own")
    ap.add_argument("--pin", choices=["auto", "on", "off"], default="auto",
                    help="the server on CPU 0, this process and the agents on the others "
                         "(taskset), so that the two do not share a core: auto pins where "
                         "there are at least two CPUs and taskset")
    ap.add_argument("--profile", default="",
                    help="record the server with py-spy into this file (an SVG flame "
                         "graph, or collapsed stacks for FILE.txt; needs py-spy, and ptrace "
                         "allowed)")
    ap.add_argument("--gather-ms", type=float, default=None,
                    help="the server's batch_gather_ms (default: its own default)")
    ap.add_argument("--profile-rate", type=int, default=100,
                    help="py-spy's samples a second (more: finer shares, more overhead)")
    ap.add_argument("--profile-after-submit", action="store_true",
                    help="start recording once the submission returns (the steady state: "
                         "exits, heartbeats and relaunches, not the registrations and the "
                         "first placement)")
    ap.add_argument("--tls", choices=["off", "on", "both"], default="off",
                    help="run plain, secured, or both in one run (then the ratios)")
    args = ap.parse_args()
    if not (math.isfinite(args.switch_ms) and args.switch_ms >= 0):
        ap.error(f"--switch-ms must be 0 or a positive number of ms (got {args.switch_ms})")
    if args.worker:
        return worker(args)
    if args.sweep:
        rows = []
        base = args.trials
        for n in (int(x) for x in args.sweep.split(",")):
            one = argparse.Namespace(**{**vars(args), "agents": n,
                                        "trials": max(1, base * n // 200)})
            rows.append(run_once(one, args.tls == "on"))
        if args.json:
            print(json.dumps(rows, indent=2))
        else:
            print("relaunch delay as the agents see it (p50, p99), and the server's own share:"
                  " an exit's arrival to the end of the batch that handled it")
            print(f"{'agents':>7}{'gpus':>6}{'trials':>8}{'p50 ms':>9}{'p99 ms':>9}"
                  f"{'server p50':>12}{'server p99':>12}{'decisions/s':>13}"
                  f"{'decision ms':>13}{'RSS MiB':>9}{'threads':>9}{'CPU ms/trial':>14}")
            for r in rows:
                print(f"{r['agents']:>7}{r['gpus']:>6}{r['trials']:>8}"
                      f"{r['relaunch_delay_p50_ms']!s:>9}{r['relaunch_delay_p99_ms']!s:>9}"
                      f"{r['server_exit_handled_p50_ms']!s:>12}"
                      f"{r['server_exit_handled_p99_ms']!s:>12}"
                      f"{r['decisions_per_s']!s:>13}{r['decision_mean_ms']!s:>13}"
                      f"{r['server_peak_rss_mib']!s:>9}{r['server_peak_threads']!s:>9}"
                      f"{r['server_cpu_ms_per_trial']!s:>14}")
        return 0
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.tls]
    results = {("tls" if secured else "plain"): run_once(args, secured) for secured in modes}
    if len(results) == 2:
        plain, secured = results["plain"], results["tls"]
        results["ratio_tls_over_plain"] = {
            k: round(secured[k] / plain[k], 3) if plain.get(k) and secured.get(k) else None
            for k in ("decisions_per_s", "relaunch_delay_p50_ms", "relaunch_delay_p99_ms",
                      "heartbeats_per_s", "connect_s", "server_peak_rss_mib")}
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for mode, result in results.items():
            print(f"== {mode}")
            for k, v in result.items():
                print(f"{k:>24}: {v}")
    if args.profile.endswith(".txt") and Path(args.profile).exists():
        print("\n".join(["== the server's profile (py-spy)", *profile_summary(
            Path(args.profile))]))
    return 0


def _secure(tmp: Path, agents: int) -> tuple[list[str], str]:
    """Certificates for the server and every agent, and an admin's token."""
    certs = tmp / "certs"
    _tls.init_ca(certs)
    _tls.issue(certs, _tls.SERVER, "localhost", alt_names=["localhost", "127.0.0.1"])
    store = SqliteStore(tmp / "bench.db")
    auth = Authenticator(store, enabled=True)
    auth.add_user(LOCAL, "bench", "admin")
    token = auth.create_token(LOCAL, "bench")[1]
    store.close()
    for i in range(agents):
        _tls.issue(certs, _tls.NODE, f"a{i:03d}")
    return ["--tls-dir", str(certs)], token


def _free_port() -> int:
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def profile_summary(path: Path, top: int = 12) -> list[str]:
    """From py-spy's collapsed stacks: the share of samples per leaf function (self) and
    per HyperSack function anywhere on the stack (inclusive), most first."""
    self_n: dict[str, int] = {}
    incl: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = [f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0].rsplit("/", 1)[-1]
                  + ")" if " (" in f else f for f in stack.split(";")]
        self_n[frames[-1]] = self_n.get(frames[-1], 0) + n
        for f in set(frames):
            if "hypersack" in f or f.split("(")[-1].startswith(
                    ("orchestrator", "decide", "book", "service", "servicers", "bridge")):
                incl[f] = incl.get(f, 0) + n
    if not total:
        return ["(no samples)"]
    out = [f"{total} samples; self, most first:"]
    out += [f"  {100 * n / total:5.1f} %  {f}" for f, n in
            sorted(self_n.items(), key=lambda x: -x[1])[:top]]
    out.append("inclusive, HyperSack's functions:")
    out += [f"  {100 * n / total:5.1f} %  {f}" for f, n in
            sorted(incl.items(), key=lambda x: -x[1])[:top]]
    return out


def busy_share(before: list[Any], after: list[Any]) -> list[float]:
    """Per CPU, the share of the time between two psutil.cpu_times(percpu=True) calls
    it was not idle."""
    out = []
    for b, a in zip(before, after, strict=True):
        total = sum(a) - sum(b)
        idle = (a.idle + getattr(a, "iowait", 0.0)) - (b.idle + getattr(b, "iowait", 0.0))
        out.append(max(0.0, 1.0 - idle / total) if total > 0 else 0.0)
    return out


def _mean(values: Iterable[float]) -> float:
    vals = list(values)
    return sum(vals) / len(vals) if vals else 0.0


def cpu_seconds(proc: psutil.Process) -> float:
    """The process's CPU time so far, user and system."""
    cpu = proc.cpu_times()
    return float(cpu.user + cpu.system)


# The server's threads by the names it gives them in the system (server/threads.py):
# its event worker, its gRPC loop, gRPC's own threads, and everything else.
THREAD_GROUPS = {"events": "events", "grpc": "grpc_loop", "event_engine": "grpc_own"}


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """Each thread of a process: its name in the system and its CPU seconds so far
    (empty where /proc cannot be read)."""
    out: dict[int, tuple[str, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue  # it ended meanwhile
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_by_thread(before: dict[int, tuple[str, float]],
                  after: dict[int, tuple[str, float]], trials: int) -> dict[str, float]:
    """The CPU the server's threads spent between two readings, in ms per trial, by
    group (THREAD_GROUPS; a thread that ended meanwhile is not counted)."""
    spent: dict[str, float] = {g: 0.0 for g in (*THREAD_GROUPS.values(), "other")}
    for tid, (name, cpu) in after.items():
        group = THREAD_GROUPS.get(name, "other")
        spent[group] += cpu - before.get(tid, (name, 0.0))[1]
    return {g: round(1000 * v / max(1, trials), 3) for g, v in spent.items()}


# The server with the interpreter's thread switch interval set (--switch-ms).
_SERVER = ("import sys; sys.setswitchinterval({}); from hypersack.server.app import main; "
           "sys.exit(main())")


def _at(xs: list[float], q: float) -> float | None:
    """The q-quantile of xs in milliseconds (None: no samples)."""
    xs = sorted(xs)
    return round(1000 * xs[int(q * (len(xs) - 1))], 1) if xs else None


def run_once(args: argparse.Namespace, secured: bool) -> dict[str, object]:

    tmp = Path(tempfile.mkdtemp(prefix="hs-bench-"))
    address = f"127.0.0.1:{_free_port()}"
    agent_address = f"127.0.0.1:{_free_port()}" if secured else address
    tls_flags, token = _secure(tmp, args.agents) if secured else ([], "")
    if secured:
        tls_flags += ["--agent-listen", agent_address]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERSACK_")}
    # The server takes 512 agents by default (max_agents); room for these.
    env["HYPERSACK_MAX_AGENTS"] = str(max(512, args.agents + 16))
    if args.gather_ms is not None:
        env["HYPERSACK_BATCH_GATHER_MS"] = f"{args.gather_ms:g}"
    cpus = sorted(os.sched_getaffinity(0))
    pinned = args.pin == "on" or (args.pin == "auto" and len(cpus) >= 2
                                  and shutil.which("taskset") is not None)
    server_cpu, others = (cpus[:1], cpus[1:]) if pinned and len(cpus) >= 2 else (cpus, cpus)
    if pinned:
        os.sched_setaffinity(0, others)  # this process, and the agent workers it starts
    prefix = ["taskset", "-c", ",".join(map(str, server_cpu))] if pinned else []
    server = subprocess.Popen(
        [*prefix, sys.executable,
         *(["-c", _SERVER.format(args.switch_ms / 1000)] if args.switch_ms
           else ["-m", "hypersack.server.app"]),
         "--listen", address, "--db",
         str(tmp / "bench.db"), "--heartbeat-interval-s", str(args.heartbeat_s),
         "--heartbeat-timeout-s", "60", "--profiles",
         str(ROOT / "examples" / "profiles-estimates.yaml"), "--log-level", "ERROR",
         *tls_flags],
        env=env, stdout=open(tmp / "server.log", "wb"), stderr=subprocess.STDOUT)
    proc = psutil.Process(server.pid)
    if pinned:
        time.sleep(0.2)  # taskset execs the server: the same pid
    spy = None

    def record() -> subprocess.Popen[bytes]:
        fmt = ["--format", "raw"] if args.profile.endswith(".txt") else []
        # --gil: samples of the thread holding the GIL only (the server's one core's
        # work), not of threads waiting for it.
        return subprocess.Popen(["py-spy", "record", "--pid", str(server.pid), "--rate",
                                 str(args.profile_rate), "--gil", "--output", args.profile,
                                 "--nonblocking",
                                 *fmt], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)

    if args.profile and not args.profile_after_submit:
        spy = record()
    workers: list[subprocess.Popen[str]] = []
    peak_rss = [0]
    peak_threads = [0]
    stop = threading.Event()

    def sample_rss() -> None:
        while not stop.is_set():
            try:
                peak_rss[0] = max(peak_rss[0], proc.memory_info().rss)
                peak_threads[0] = max(peak_threads[0], proc.num_threads())
            except psutil.Error:
                return
            time.sleep(0.1)

    threading.Thread(target=sample_rss, daemon=True).start()
    try:
        client = Client(address, timeout_s=60, token=token or None,
                        credentials=_tls.channel_credentials(tmp / "certs" / "ca.crt")
                        if secured else None)
        deadline = time.monotonic() + 30
        while True:
            try:
                client.studies()
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        bench = Bench(args.min_s, args.max_s)
        bench.say_processed = not args.no_processed
        t0 = time.monotonic()
        no_pending = tmp / "no-pending"
        procs = max(1, args.agent_procs)
        cuts = [args.agents * k // procs for k in range(procs + 1)]
        for k in range(procs):
            workers.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", "--first", str(cuts[k]),
                 "--agents", str(cuts[k + 1] - cuts[k]), "--gpus", str(args.gpus),
                 "--address", agent_address, "--min-s", str(args.min_s),
                 "--max-s", str(args.max_s), "--heartbeat-s", str(args.heartbeat_s),
                 "--beats", args.beats, "--acks", args.acks,
                 "--no-pending", str(no_pending),
                 *(["--unbatched"] if args.unbatched else []),
                 *(["--no-processed"] if args.no_processed else []),
                 *(["--certs", str(tmp / "certs")] if secured else [])],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
        for w in workers:
            assert w.stdout is not None
            if w.stdout.readline().strip() != "ready":
                raise RuntimeError("an agent worker did not start")
        connect_s = time.monotonic() - t0
        t_submit = time.monotonic()
        cpu_at_submit = cpu_seconds(proc)
        cores_at_submit = psutil.cpu_times(percpu=True)
        study = client.submit(SPACE.format(
            trials=args.trials,
            models="[shufflenet, mobilenet_v2, vit_tiny, deit_tiny, resnet18, resnet34]"
            if args.mixed else "[resnet18]",
            batch_sizes="[64, 128, 256, 512]" if args.mixed else "[128]"), "load.yaml")
        submit_s = time.monotonic() - t_submit
        if args.profile and args.profile_after_submit:
            spy = record()  # the trials' life only: exits, heartbeats, relaunches
        cpu_submit_s = cpu_seconds(proc) - cpu_at_submit
        threads_at_submit = thread_cpu(server.pid)
        total = sum(study.counts.values())
        last_print = 0.0
        while True:
            s = client.study(study.id)
            done = s.counts.get("COMPLETED", 0) + s.counts.get("FAILED", 0)
            bench.pending_left = s.counts.get("PENDING", 0) > 0
            if not bench.pending_left and not no_pending.exists():
                no_pending.touch()
            if time.monotonic() - last_print > 5:
                print(f"  {time.monotonic() - t_submit:6.1f} s: {done}/{total} done, "
                      f"{s.counts.get('RUNNING', 0)} running", file=sys.stderr)
                last_print = time.monotonic()
            if s.state != "ACTIVE":
                break
            time.sleep(0.5)
        wall = time.monotonic() - t_submit
        cpu_s = cpu_seconds(proc) - cpu_at_submit
        threads_split = cpu_by_thread(threads_at_submit, thread_cpu(server.pid), total)
        cores = busy_share(cores_at_submit, psutil.cpu_times(percpu=True))
        stop.set()
        agent_lags: list[float] = []
        for w in workers:
            out, _ = w.communicate(timeout=60)  # closes its stdin: it reports and exits
            got = json.loads(out.strip().splitlines()[-1])
            bench.delays += got["delays"]
            agent_lags += got["lags"]
            bench.launches += got["launches"]
            bench.heartbeats_sent += got["heartbeats"]
            bench.kills += got["kills"]
            bench.received += got["received"]
            bench.ack_delays += got["ack_delays"]
            bench.ack_delays_pending += got["ack_delays_pending"]
            bench.superseded += got["superseded"]
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(60)
        server.send_signal(signal.SIGTERM)
        server.wait(30)
        stats = {}
        for line in (tmp / "server.log").read_text().splitlines():
            if line.startswith("{"):
                stats = json.loads(line)
        d = sorted(bench.delays)
        result = {
            "tls": secured, "agents": args.agents, "agent_procs": args.agent_procs,
            "heartbeats": f"every {args.heartbeat_s:g} s, {args.beats}",
            "acks": args.acks, "batched": not args.unbatched,
            "batch_gather_ms": "server default" if args.gather_ms is None else args.gather_ms,
            "pinned": (f"server on CPU {','.join(map(str, server_cpu))}, agents on "
                       f"{','.join(map(str, others))}") if pinned else "no",
            "gpus": args.agents * args.gpus, "trials": total,
            "connect_s": round(connect_s, 2), "submit_s": round(submit_s, 3),
            "study_wall_s": round(wall, 1), "launches": bench.launches,
            "kills": bench.kills, "superseded_timers": bench.superseded,
            "decisions": stats.get("decisions"),
            "decisions_per_s": round(stats.get("decisions", 0) / wall, 1),
            "decision_mean_ms": stats.get("decision_mean_ms"),
            "server_exit_handled_p50_ms": stats.get("exit_handled_p50_ms"),
            "server_exit_handled_p99_ms": stats.get("exit_handled_p99_ms"),
            "server_batch_p50_ms": stats.get("batch_p50_ms"),
            "server_batch_p99_ms": stats.get("batch_p99_ms"),
            # How late the server's gRPC loop and the agent workers' loops ran a timer set
            # every 50 ms: where a message waits in transport, on either side.
            # The cyclic garbage collector's full collections in the server: each stops
            # every thread, the loop too.
            "server_gc_full_collections": stats.get("gc_full_collections"),
            "server_gc_full_max_ms": stats.get("gc_full_max_ms"),
            "server_gc_full_ms": stats.get("gc_full_last_ms"),
            # The five-minute collections among them, and the objects they freed: the
            # cycles that piled up meanwhile.
            "server_gc_scheduled": [stats.get("gc_scheduled_runs"),
                                    stats.get("gc_scheduled_freed")],
            "server_loop_lag_p50_ms": stats.get("loop_lag_p50_ms"),
            "server_loop_lag_p99_ms": stats.get("loop_lag_p99_ms"),
            "agents_loop_lag_p50_ms": _at(agent_lags, 0.5),
            "agents_loop_lag_p99_ms": _at(agent_lags, 0.99),
            "heartbeats_handled": stats.get("heartbeats"),
            "heartbeats_per_s": round(stats.get("heartbeats", 0) / wall, 1),
            # Messages the server wrote to the agents' streams, per second of the study.
            "server_messages_per_s": round(bench.received / wall, 1),
            "exit_ack_p50_ms": _at(bench.ack_delays, 0.5),
            "exit_ack_p99_ms": _at(bench.ack_delays, 0.99),
            "exit_ack_while_pending_p50_ms": _at(bench.ack_delays_pending, 0.5),
            "exit_ack_while_pending_p99_ms": _at(bench.ack_delays_pending, 0.99),
            "relaunch_delay_samples": len(d),
            "relaunch_delay_p50_ms": round(1000 * statistics.median(d), 1) if d else None,
            "relaunch_delay_p99_ms": _at(d, 0.99),
            "server_peak_rss_mib": round(peak_rss[0] / 2**20, 1),
            "server_peak_threads": peak_threads[0],
            # CPU the server spent from the submission to the study's end, per trial: its
            # cost, whatever else shares the machine's cores.
            "server_cpu_ms_per_trial": round(1000 * cpu_s / max(1, total), 2),
            # The same split: the submission (expanding and storing the trials) and the
            # rest (deciding, launching, exits, heartbeats).
            "server_cpu_ms_per_trial_submit": round(1000 * cpu_submit_s / max(1, total), 2),
            "server_cpu_ms_per_trial_after": round(1000 * (cpu_s - cpu_submit_s)
                                                   / max(1, total), 2),
            # The rest by thread (read from /proc): the event worker (the core, the
            # store, reading messages into events), the gRPC loop (the streams), gRPC's
            # own threads (its poller and event engine), and the others.
            "server_cpu_ms_per_trial_after_by_thread": threads_split,
            # How busy the server's and the agents' cores were during the study: an
            # agents' core near 100 % means the delays measure the load generator.
            "server_core_busy_pct": round(100 * _mean(cores[c] for c in server_cpu), 1),
            "agent_cores_busy_pct": round(100 * _mean(cores[c] for c in others), 1),
        }
    except BaseException:
        print(f"kept {tmp} (the server's log and store)", file=sys.stderr)
        raise
    else:
        shutil.rmtree(tmp, ignore_errors=True)  # 40 MB of store a run at 50,000 trials
    finally:
        stop.set()
        for w in workers:
            if w.poll() is None:
                w.kill()
        if server.poll() is None:
            server.kill()
    return result


if __name__ == "__main__":
    sys.exit(main())
