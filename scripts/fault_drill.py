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

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypersack.testing.cluster import (
    ATTEMPT_LOGGER,
    Cluster,
    attempt_runs,
    done,
    overlapping,
    submit,
    trials,
)

TRIALS = 48
SECONDS = 3.0  # each trial's run
TIMEOUT_S = 4.0  # the heartbeat timeout; heartbeats every 0.5 s
FLAGS = ("--heartbeat-interval-s", "0.5", "--heartbeat-timeout-s", str(TIMEOUT_S))


def space(program: Path, log: Path) -> str:
    lrs = ", ".join(f"{0.0001 * (i + 1):.4f}" for i in range(TRIALS))
    return f"""
name: drill
models: [resnet18]
hyperparameters: {{batch_size: [64], lr: [{lrs}]}}
settings: {{epochs: 1, retries: 2, fusion: 'off', oversubscription: {{A100: 3.0}},
            demand: {{compute_pct: 40, memory_mib: 2000, cores: 2}}}}
program: {{command: '{{python}} {program} {log} {SECONDS}'}}
"""


def immutable(paths: list[Path], on: bool) -> None:
    for p in paths:
        if p.exists():
            subprocess.run(["chattr", "+i" if on else "-i", str(p)], check=True)


def orphans(program: Path) -> int:
    """Processes of the drill's trial program still alive."""
    found = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        found += str(program).encode() in cmd and state != "Z"
    return found


def fault(scenario: str, c: Cluster) -> None:
    assert c.server is not None
    db = [c.db, Path(f"{c.db}-wal"), Path(f"{c.db}-shm")]
    if scenario == "readonly":
        immutable(db, True)
        try:
            time.sleep(15.0)
        finally:
            immutable(db, False)
    elif scenario == "fsize":
        size = max(p.stat().st_size for p in db if p.exists())
        # The soft limit only: raising a hard limit back needs CAP_SYS_RESOURCE.
        subprocess.run(["prlimit", f"--pid={c.server.pid}", f"--fsize={size}:"], check=True)
        time.sleep(15.0)
        subprocess.run(["prlimit", f"--pid={c.server.pid}", "--fsize=unlimited:"],
                       check=True)
    elif scenario == "freeze":
        frozen = c.agents["n1"]
        os.kill(frozen.pid, signal.SIGSTOP)
        time.sleep(3 * TIMEOUT_S)
        os.kill(frozen.pid, signal.SIGCONT)
    elif scenario == "kill9":
        c.kill_server()
        c.start_server(*FLAGS)
        time.sleep(3.0)
        c.kill_agent("n2")  # the agent only
        c.start_agent("n2")
    else:
        raise SystemExit(f"unknown scenario {scenario!r}")


def run(scenario: str) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix=f"drill-{scenario}-"))
    program, log = root / "program.py", root / "runs.log"
    program.write_text(ATTEMPT_LOGGER)
    c = Cluster(root, tls=False)
    began = time.monotonic()
    try:
        c.start_server(*FLAGS)
        c.start_agent("n1")
        c.start_agent("n2")
        study = submit(c, space(program, log))
        time.sleep(4.0)  # mid-study
        fault(scenario, c)
        ended = done(c, study, 300)
        time.sleep(1.0)
        runs = attempt_runs(log)
        return {"scenario": scenario,
                "completed": sum(t.state == "COMPLETED" for t in ended),
                "executions": sum(finished for *_, finished in runs.values()),
                "attempts": len(runs), "at_once": len(overlapping(runs)),
                "orphans": orphans(program), "failures_counted": sum(t.failures for t in
                                                                     trials(c, study)),
                "seconds": round(time.monotonic() - began, 1)}
    finally:
        c.stop()
        if os.environ.get("KEEP_DRILL") is None:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root}", file=sys.stderr)


def main() -> None:
    for scenario in sys.argv[1:] or ["readonly", "fsize", "freeze", "kill9"]:
        print(json.dumps(run(scenario)), flush=True)


if __name__ == "__main__":
    main()
