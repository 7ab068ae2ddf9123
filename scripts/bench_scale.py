#!/usr/bin/env python3
"""How one decision's solve time grows with pending trials and GPUs.

Synthetic but realistic: trials drawn from the 24 SP4 workloads (example estimated
profiles, A100, ratio 3) on nodes of 4 A100 with 88 cores. Reports the median time per
policy at three sizes, and each size's time relative to the smallest measured in the
same run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from _instances import EXAMPLES

from hypersack.policies import make_policy
from hypersack.policies.base import (
    ClusterView,
    GpuBin,
    Item,
    Need,
    NodeBin,
    check_plan,
    compute_capacity,
    core_units,
)
from hypersack.sampler.profiles import load_profiles

SIZES = [(1_000, 100), (10_000, 1_000), (30_000, 3_000)]


def instance(trials: int, gpus: int, seed: int = 0) -> tuple[list[Item], ClusterView]:
    rng = random.Random(seed)
    needs = [{"A100": Need.of(p.demand)} for p in
             load_profiles(EXAMPLES / "profiles-estimates.yaml")
             if p.arch == "A100" and p.key.model in
             ("shufflenet", "mobilenet_v2", "vit_tiny", "deit_tiny", "resnet18", "resnet34")]
    items = []
    for i in range(trials):
        k = rng.randrange(len(needs))
        items.append(Item(f"t{i}", needs[k], run_time_s=float(10 + k)))
    cap = compute_capacity(3.0)
    nodes = []
    for n in range(gpus // 4):
        bins = tuple(GpuBin(f"n{n}", g, "A100", cap, 81920, cap, 81920) for g in range(4))
        nodes.append(NodeBin(f"n{n}", core_units(88), bins, core_units(88)))
    return items, ClusterView(tuple(nodes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    results: dict[str, list[float]] = {}
    print(f"{'trials':>7}{'GPUs':>6}  " + "".join(f"{p:>14}" for p in ("ff", "ffd", "wf", "wfd"))
          + "   (median ms; x = time / time at the smallest size)")
    for trials, gpus in SIZES:
        items, view = instance(trials, gpus)
        row = []
        for name in ("ff", "ffd", "wf", "wfd"):
            policy = make_policy(name)
            check_plan(items, view, policy.place(items, view))
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                policy.place(items, view)
                times.append(time.perf_counter() - start)
            t = statistics.median(times)
            results.setdefault(name, []).append(t)
            row.append(f"{t * 1000:8.2f} x{t / results[name][0]:<4.0f}")
        print(f"{trials:>7}{gpus:>6}  " + "".join(f"{c:>14}" for c in row))
    wfd_10k = results["wfd"][1] * 1000
    print(f"\nwfd, 10,000 trials on 1,000 GPUs: {wfd_10k:.1f} ms (target: under 100 ms)")


if __name__ == "__main__":
    main()
