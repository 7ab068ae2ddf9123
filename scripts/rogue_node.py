"""A rogue node's heartbeats (many trials the server never gave it; it never reads its
stream) against a real server process: prints the server's RSS against its idle size
and the latency of `status` meanwhile (hypersack.testing.rogue).

    python scripts/rogue_node.py --seconds 20 --trials 100000
"""

from __future__ import annotations

import argparse
import statistics
import sys

from hypersack.testing.rogue import run_rogue


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--trials", type=int, default=100_000, help="trials in each heartbeat")
    p.add_argument("--every", type=float, default=0.5, help="seconds between heartbeats")
    args = p.parse_args()
    run = run_rogue(args.seconds, args.trials, args.every)
    finite = [s for s in run.status_s if s != float("inf")]
    print(f"rogue node: {run.heartbeats} heartbeats of {args.trials} unknown trials in "
          f"{args.seconds:g} s")
    print(f"server RSS: idle {run.idle_rss_mib:.0f} MiB, peak {max(run.rss_mib):.0f} MiB "
          f"({run.peak_ratio:.2f}x idle), last {run.rss_mib[-1]:.0f} MiB")
    if finite:
        print(f"status latency: median {1000 * statistics.median(finite):.0f} ms, max "
              f"{1000 * max(finite):.0f} ms ({len(run.status_s) - len(finite)} failed)")
    print(f"the rogue's stream: {run.stream_ended or 'still open'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
