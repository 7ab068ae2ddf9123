"""Fault drill: a real server and two agents (fake GPUs) on loopback run a 48-trial command
study whose program appends its trial id and attempt to a shared log; mid-study one fault:

  readonly   the database files made immutable (chattr +i: read-only even for root and for
             files already open) for 15 s
  fsize      the server's file-size limit lowered to the database's size for 15 s (a full
             disk, as prlimit makes it)
  freeze     one agent SIGSTOPped for three heartbeat timeouts, then continued
  kill9      kill -9 of the server (restarted at once), then of an agent (restarted)

For each: trials completed, executions (runs to the end, from the program's own log),
attempts started, trials that ran in two places at once (from their logged times), and
orphans (trial processes alive after the study). The goal in every row: 48 completed, 48
executions, 0 at once, 0 orphans. Needs root (chattr, prlimit) and Linux.

    python scripts/fault_drill.py [SCENARIO ...]   (default: all four)
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypersack.cli.client import Client

TRIALS = 48
SECONDS = 3.0  # each trial's run
HEARTBEAT_S, TIMEOUT_S = "0.5", "4"

PROGRAM = """
import os, signal, sys, time
log, seconds = sys.argv[1], float(sys.argv[2])
me = f"{os.environ['HYPERSACK_TRIAL_ID']} {os.environ['HYPERSACK_ATTEMPT']}"
def say(what):
    with open(log, "a") as f:
        f.write(f"{what} {me} {time.time():.3f}\\n")
def stopped(*_):
    say("killed")
    sys.exit(143)
signal.signal(signal.SIGTERM, stopped)
say("start")
end = time.monotonic() + seconds
while time.monotonic() < end:
    say("alive")
    time.sleep(0.1)
say("end")
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Drill:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.address = f"127.0.0.1:{free_port()}"
        self.db = root / "server.db"
        self.log = root / "runs.log"
        self.program = root / "program.py"
        self.program.write_text(PROGRAM)
        self.server: subprocess.Popen[bytes] | None = None
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERSACK_")}

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        out = open(self.root / f"{name}.log", "ab")
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                cwd=self.root, start_new_session=True)

    def start_server(self) -> None:
        self.server = self.spawn("server", [
            sys.executable, "-m", "hypersack.server.app", "--listen", self.address,
            "--db", str(self.db), "--heartbeat-interval-s", HEARTBEAT_S,
            "--heartbeat-timeout-s", TIMEOUT_S])
        self.wait("the server", lambda: self.client_ok(), 60)

    def start_agent(self, name: str) -> None:
        flags = ["--allow-commands"] + (["--allow-root-trials"] if os.geteuid() == 0 else [])
        self.agents[name] = self.spawn(name, [
            sys.executable, "-m", "hypersack.agent.app", "--server", self.address,
            "--node", name, "--backend", "fake", "--inventory", "1xA100-80GB@48",
            "--workdir", str(self.root / "work"), *flags])

    def client_ok(self) -> bool:
        try:
            with Client(self.address, timeout_s=2) as c:
                c.studies()
            return True
        except Exception:
            return False

    @staticmethod
    def wait(what: str, check: object, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if check():  # type: ignore[operator]
                    return
            except Exception:
                pass
            time.sleep(0.2)
        raise SystemExit(f"timed out waiting for {what}")

    def submit(self) -> str:
        lrs = ", ".join(f"{0.0001 * (i + 1):.4f}" for i in range(TRIALS))
        space = f"""
name: drill
models: [resnet18]
hyperparameters: {{batch_size: [64], lr: [{lrs}]}}
settings: {{epochs: 1, retries: 2, fusion: 'off', oversubscription: {{A100: 3.0}},
            demand: {{compute_pct: 40, memory_mib: 2000, cores: 2}}}}
program: {{command: '{{python}} {self.program} {self.log} {SECONDS}'}}
"""
        with Client(self.address, timeout_s=10) as c:
            return str(c.submit(space, "drill.yaml").id)

    def trials(self, study: str) -> list:  # type: ignore[type-arg]
        with Client(self.address, timeout_s=10) as c:
            return c.trials(study)

    def done(self, study: str) -> bool:
        with Client(self.address, timeout_s=10) as c:
            return str(c.study(study).state) != "ACTIVE"

    def stop(self) -> None:
        for p in [*self.agents.values(), *([self.server] if self.server else [])]:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in [*self.agents.values(), *([self.server] if self.server else [])]:
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def immutable(paths: list[Path], on: bool) -> None:
    for p in paths:
        if p.exists():
            subprocess.run(["chattr", "+i" if on else "-i", str(p)], check=True)


def orphans(root: Path) -> int:
    """Trial programs of this drill still alive."""
    found = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if str(root / "program.py").encode() in cmd and state != "Z":
            found += 1
    return found


def count(log: Path) -> dict[str, int]:
    runs: dict[tuple[str, str], list[float]] = {}
    ended: set[tuple[str, str]] = set()
    for line in log.read_text().splitlines():
        what, trial, attempt, at = line.split()
        runs.setdefault((trial, attempt), []).append(float(at))
        if what == "end":
            ended.add((trial, attempt))
    by_trial: dict[str, list[tuple[float, float]]] = {}
    for (trial, _), times in runs.items():
        by_trial.setdefault(trial, []).append((min(times), max(times)))
    at_once = 0
    for spans in by_trial.values():
        spans.sort()
        at_once += any(a[1] >= b[0] for a, b in itertools.pairwise(spans))
    return {"executions": len(ended), "attempts": len(runs), "at_once": at_once}


def run(scenario: str) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix=f"drill-{scenario}-"))
    d = Drill(root)
    began = time.monotonic()
    try:
        d.start_server()
        d.start_agent("n1")
        d.start_agent("n2")
        study = d.submit()
        time.sleep(4.0)  # mid-study
        if scenario == "readonly":
            files = [d.db, Path(f"{d.db}-wal"), Path(f"{d.db}-shm")]
            immutable(files, True)
            time.sleep(15.0)
            immutable(files, False)
        elif scenario == "fsize":
            assert d.server is not None
            size = max(os.path.getsize(d.db), os.path.getsize(f"{d.db}-wal"))
            # The soft limit only: raising a hard limit back needs CAP_SYS_RESOURCE.
            subprocess.run(["prlimit", f"--pid={d.server.pid}", f"--fsize={size}:"],
                           check=True)
            time.sleep(15.0)
            subprocess.run(["prlimit", f"--pid={d.server.pid}", "--fsize=unlimited:"],
                           check=True)
        elif scenario == "freeze":
            frozen = d.agents["n1"]
            os.kill(frozen.pid, signal.SIGSTOP)
            time.sleep(3 * float(TIMEOUT_S))
            os.kill(frozen.pid, signal.SIGCONT)
        elif scenario == "kill9":
            assert d.server is not None
            os.killpg(d.server.pid, signal.SIGKILL)
            d.server.wait()
            d.start_server()
            time.sleep(3.0)
            os.kill(d.agents["n2"].pid, signal.SIGKILL)  # the agent only
            d.agents["n2"].wait()
            d.start_agent("n2")
        d.wait("the study to end", lambda: d.done(study), 300)
        trials = d.trials(study)
        time.sleep(1.0)
        row: dict[str, object] = {
            "scenario": scenario,
            "completed": sum(t.state == "COMPLETED" for t in trials),
            **count(d.log), "orphans": orphans(root),
            "failures_counted": sum(t.failures for t in trials),
            "seconds": round(time.monotonic() - began, 1)}
        return row
    finally:
        d.stop()
        immutable([d.db, Path(f"{d.db}-wal"), Path(f"{d.db}-shm")], False)
        subprocess.run(["pkill", "-f", str(root)], check=False)
        if os.environ.get("KEEP_DRILL") is None:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}", file=sys.stderr)


def main() -> None:
    scenarios = sys.argv[1:] or ["readonly", "fsize", "freeze", "kill9"]
    for s in scenarios:
        print(json.dumps(run(s)), flush=True)


if __name__ == "__main__":
    main()
