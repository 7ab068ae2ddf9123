"""SP1 (sleep program) on three fake-backend agents on this machine, each its own process.

    python scripts/demo_fake_cluster.py            # runs to the end
    python scripts/demo_fake_cluster.py --faults   # SIGKILL one agent half-way, and the
                                                   # server once (restarted on its database)
Prints the study's wall time, trials completed, launches and re-runs.
"""

from __future__ import annotations

import argparse
import os
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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--faults", action="store_true")
    ap.add_argument("--inventory", default="1xA100-80GB@24", help="per agent")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="hs-demo-"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{s.getsockname()[1]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HYPERSACK_")}
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def spawn(name: str, argv: list[str]) -> None:
        procs[name] = subprocess.Popen(argv, env=env, cwd=tmp, start_new_session=True,
                                       stdout=open(tmp / f"{name}.log", "ab"),
                                       stderr=subprocess.STDOUT)

    def server() -> None:
        spawn("server", [sys.executable, "-m", "hypersack.server.app", "--listen", address,
                         "--db", str(tmp / "db.sqlite"), "--heartbeat-interval-s", "1",
                         "--heartbeat-timeout-s", "5", "--profiles",
                         str(ROOT / "examples" / "profiles-estimates.yaml")])

    def wait_up(c: Client) -> None:
        for _ in range(300):
            try:
                c.studies()
                return
            except Exception:
                time.sleep(0.1)
        raise SystemExit(f"server did not start; see {tmp}/server.log")

    server()
    for i in range(3):
        spawn(f"agent{i}", [sys.executable, "-m", "hypersack.agent.app", "--server", address,
                            "--node", f"node{i}", "--backend", "fake", "--inventory",
                            args.inventory, "--workdir", str(tmp / "work"),
                            *(["--allow-root-trials"] if os.geteuid() == 0 else [])])
    client = Client(address)
    wait_up(client)
    time.sleep(1)
    t0 = time.monotonic()
    study = client.submit((ROOT / "examples" / "sp1-sleep.yaml").read_text(), "sp1-sleep.yaml")
    total = sum(study.counts.values())
    killed_agent = killed_server = False
    while True:
        try:
            s = client.study(study.id)
        except Exception:
            time.sleep(0.2)
            continue
        done = s.counts.get("COMPLETED", 0) + s.counts.get("FAILED", 0)
        if args.faults and not killed_agent and done >= total // 2:
            os.kill(procs["agent2"].pid, signal.SIGKILL)
            killed_agent = True
            print(f"{time.monotonic() - t0:6.1f} s: SIGKILL node2's agent ({done}/{total} done)")
        if args.faults and killed_agent and not killed_server and done >= 2 * total // 3:
            os.killpg(procs["server"].pid, signal.SIGKILL)
            procs["server"].wait()
            killed_server = True
            print(f"{time.monotonic() - t0:6.1f} s: SIGKILL the server ({done}/{total} done)")
            time.sleep(1)
            server()
            wait_up(client)
            print(f"{time.monotonic() - t0:6.1f} s: server restarted on its database")
            continue
        if s.state != "ACTIVE":
            break
        time.sleep(0.5)
    wall = time.monotonic() - t0
    trials = client.trials(study.id)
    states: dict[str, int] = {}
    for t in trials:
        states[t.state] = states.get(t.state, 0) + 1
    launches = sum(t.launches for t in trials)
    print(f"{study.id}: {s.state} in {wall:.1f} s; {states}; {launches} launches for "
          f"{len(trials)} trials ({launches - len(trials)} re-runs); every trial has "
          f"{'one result' if all(t.has_objective for t in trials) else 'NOT all results'}")
    for p in procs.values():
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs.values():
        p.wait(15)
    subprocess.run(["pkill", "-f", str(tmp / "work")], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
