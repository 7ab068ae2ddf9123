#!/usr/bin/env python3
"""`pack` and `auto` on heterogeneous instances that tuning never saw (issue 37, 2): the
work each places as a share of CP-SAT's plan, and its median solve time of three.

The instances are `bench_policies.py`'s heterogeneous mixes at other seeds (mixed 36-45,
memory and compute 18-22, cpu 11-15); CP-SAT gets `--limit` seconds on `--workers`
workers, and its proven gap to the bound is printed beside each.

    python scripts/bench_pack_heldout.py                # 30 s, one worker (about 13 min)
    python scripts/bench_pack_heldout.py --limit 5      # a quick look
    python scripts/bench_pack_heldout.py --shapes       # other shapes (sim/instances.SHAPES)

`--shapes`: clusters and classes of other shapes than those mixes' (every trial a class
of its own; 4 GPUs; one architecture with 8 GPUs a node; classes of 20-60 trials; work
little more than fits), mixed, memory and compute, seeds 0 and 1: 30 instances.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from _instances import SHAPES, heterogeneous, shaped

from hypersack.policies import kernels, make_policy

CASES = [("mixed", s) for s in range(36, 46)] + [("memory", s) for s in range(18, 23)] + \
    [("compute", s) for s in range(18, 23)] + [("cpu", s) for s in range(11, 16)]
SHAPED = [(shape, mix, s) for shape in SHAPES for mix in ("mixed", "memory", "compute")
          for s in (0, 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=float, default=30.0, help="CP-SAT seconds per instance")
    ap.add_argument("--workers", type=int, default=1, help="CP-SAT workers")
    ap.add_argument("--shapes", action="store_true",
                    help="instances of other shapes (see above) instead of the mixes")
    args = ap.parse_args()
    if not (0 < args.limit <= 86400 and 1 <= args.workers <= 1024):
        ap.error("--limit must lie in (0, 86400] seconds (the optimal policy's bound) and "
                 "--workers in [1, 1024]")
    kernels.compile_now()  # before any clock starts
    shares: dict[str, list[float]] = {"pack": [], "auto": []}
    times: list[float] = []
    cases = [(f"{shape} {mix}", seed, shaped(shape, mix, seed)) for shape, mix, seed in SHAPED] \
        if args.shapes else [(mix, seed, heterogeneous(mix, seed)) for mix, seed in CASES]
    for label, seed, (items, view) in cases:
        ref = make_policy("optimal", time_limit_s=args.limit, workers=args.workers,
                          seed=0).place(items, view)
        line = f"{label}:{seed:<3} {len(items):>4} items  cp-sat gap {ref.gap() or 0.0:.4f}"
        for name in ("pack", "auto"):
            took = []
            for _ in range(3):
                began = time.perf_counter()
                plan = make_policy(name).place(items, view)
                took.append(1000 * (time.perf_counter() - began))
            share = 100 * plan.objective / ref.objective if ref.objective else 100.0
            shares[name].append(share)
            if name == "pack":
                times.append(statistics.median(took))
            line += f"  {name} {share:7.2f}% {statistics.median(took):6.1f} ms"
        print(line, flush=True)
    for name, got in shares.items():
        print(f"{name}: {sum(x >= 99 for x in got)} of {len(got)} at 99 % or more of CP-SAT's "
              f"plan, min {min(got):.2f} %, mean {statistics.mean(got):.2f} %"
              + (f"; median {statistics.median(times):.1f} ms, max {max(times):.1f} ms"
                 if name == "pack" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
