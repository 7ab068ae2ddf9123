"""One agent, many concurrent trials: does liveness hold while it launches them all?

A real `hypersack-server` and one real `hypersack-agent` (fake backend, a large made-up
inventory) as processes on loopback; N trials that each run `sleep SECONDS` (a tiny
process, so that N of them fit in memory), profiles from a file that lets them all run
at once. Reported: wall time, launches per trial (target: exactly 1 each), node losses
and discarded (stale) exits from the server's log (target: 0 each), and the wall time
against the ideal (one wave of SECONDS) as a ratio.

    python scripts/bench_agent_load.py                       # 1,000 trials of 10 s
    python scripts/bench_agent_load.py --trials 200 --seconds 5
"""

from __future__ import annotations

import argparse
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hypersack.cli.client import Client  # noqa: E402

PROFILE = """profiles:
- {model: resnet18, batch_size: 64, arch: A100, compute_pct: 1, memory_mib: 100,
   cores: 0.1, iter_time_s: 0.1, iters_per_epoch: 10}
"""

SPACE = """
name: load
models: [resnet18]
hyperparameters:
  batch_size: [64]
  lr: {{distribution: uniform, low: 0.0, high: 1.0, num: {trials}}}
settings: {{epochs: 1, retries: 0, oversubscription: {{A100: 1.0}}}}
program: {{command: "sleep {seconds}"}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--heartbeat-timeout-s", type=float, default=6.0)
    ap.add_argument("--inventory", default="32xA100-80GB@4000")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hs-agent-load-"))
    (tmp / "profiles.yaml").write_text(PROFILE)
    port = free_port()
    address = f"127.0.0.1:{port}"
    server_log = open(tmp / "server.log", "wb")
    agent_log = open(tmp / "agent.log", "wb")
    server = subprocess.Popen(
        [sys.executable, "-m", "hypersack.server.app", "--listen", address, "--db",
         str(tmp / "s.db"), "--heartbeat-interval-s", "1", "--heartbeat-timeout-s",
         str(args.heartbeat_timeout_s), "--profiles", str(tmp / "profiles.yaml")],
        stdout=server_log, stderr=subprocess.STDOUT, start_new_session=True)
    agent = subprocess.Popen(
        [sys.executable, "-m", "hypersack.agent.app", "--server", address, "--node", "big",
         "--backend", "fake", "--inventory", args.inventory, "--workdir", str(tmp / "work"),
         "--allow-commands", "sleep",
         # A root agent needs a user for its trials; this bench runs on one's own machine.
         *(["--allow-root-trials"] if os.geteuid() == 0 else [])],
        stdout=agent_log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        with Client(address, timeout_s=30) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.nodes():
                        break
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit("the agent did not register")
                time.sleep(0.2)
            started = time.monotonic()
            study = client.submit(SPACE.format(trials=args.trials, seconds=args.seconds),
                                  "load.yaml")
            while client.study(study.id).state == "ACTIVE":
                time.sleep(0.5)
                if time.monotonic() - started > 60 * 20:
                    raise SystemExit("the study did not finish in 20 minutes")
            wall = time.monotonic() - started
            trials = client.trials(study.id)
    finally:
        for proc in (agent, server):
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in (agent, server):
            proc.wait(timeout=30)
        server_log.close()
        agent_log.close()
    log = (tmp / "server.log").read_text(errors="replace")
    launches = [t.launches for t in trials]
    result = {
        "trials": len(trials), "seconds_per_trial": args.seconds,
        "heartbeat_timeout_s": args.heartbeat_timeout_s,
        "states": {s: sum(t.state == s for t in trials) for s in {t.state for t in trials}},
        "wall_s": round(wall, 1), "wall_vs_one_wave": round(wall / args.seconds, 2),
        "launches_per_trial": {"min": min(launches), "max": max(launches),
                               "mean": round(sum(launches) / len(launches), 3)},
        "node_losses": log.count(" lost ("),
        "discarded_exits": log.count("ignored an event"),
        "failed_reasons": sorted({f"{t.reason}: {t.log_tail[-200:]}" for t in trials
                                  if t.state == "FAILED"})[:5],
    }
    print(json.dumps(result, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)  # the store, the logs and the trials' workdirs
    return 0


if __name__ == "__main__":
    sys.exit(main())
