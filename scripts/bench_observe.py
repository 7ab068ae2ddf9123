#!/usr/bin/env python3
"""What finding the node's trial process trees costs the agent's command thread, once a
second while a device backend observes trials (NVML, CPU): each trial's tree scanned
from /proc one trial at a time (`tree`, as before 2026-11-28), against one scan for all
of them (`children_map`, now). N trials, each a shell with a sleeping child; median of
`--repeats`, ms, and the ratio in the same run.

    python scripts/bench_observe.py --trials 16
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from hypersack.agent.launcher import Job
from hypersack.agent.procs import children_map


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="hs-observe-"))
    jobs = [Job(f"t{i}", 0, root / f"t{i}", ["sh", "-c", "sleep 600 & wait"], {})
            for i in range(args.trials)]
    for job in jobs:
        job.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(
                job.proc is not None and psutil.Process(job.proc.pid).children()
                for job in jobs):
            time.sleep(0.05)
        each, once = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            for job in jobs:
                job.pids()
            each.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            children = children_map()
            for job in jobs:
                job.pids(children)
            once.append(time.perf_counter() - t0)
        a, b = 1000 * statistics.median(each), 1000 * statistics.median(once)
        print(f"{args.trials} trials, {len(psutil.pids())} processes on this machine: "
              f"a scan per trial {a:.2f} ms, one scan {b:.2f} ms ({a / b:.1f}x)")
    finally:
        for job in jobs:
            job.kill()
        for job in jobs:
            if job.proc is not None:
                job.proc.wait(10)


if __name__ == "__main__":
    main()
