#!/usr/bin/env python3
"""The HyperSack paper's Table III, reproduced in shape: per policy, on the first decision
of SP3 on 4 A100 and SP4 on 16 A100 (ratio 3, example estimated profiles), the occupancy
of scaled compute, the median time to solve, and the gap to the CP-SAT optimum.

Times are also given relative to FF measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _instances import EXAMPLES, first_decision

from hypersack.policies import make_policy
from hypersack.policies.base import check_plan

CASES = [("SP3 on 4 GPUs", "sp3.yaml", "1x4xA100-80GB@88"),
         ("SP4 on 16 GPUs", "sp4.yaml", "4x4xA100-80GB@88")]


def median_time(policy: object, items: list, view: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        policy.place(items, view)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=500)
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=1, help="CP-SAT workers")
    args = parser.parse_args()
    for title, space, cluster in CASES:
        items, view = first_decision(EXAMPLES / space, cluster)
        capacity = sum(g.total_compute for n in view.nodes for g in n.gpus)
        optimal = make_policy("optimal", time_limit_s=args.time_limit, workers=args.workers)
        start = time.perf_counter()
        best = optimal.place(items, view)
        opt_time = time.perf_counter() - start
        check_plan(items, view, best)
        bound = best.bound or best.objective
        print(f"\n{title}: {len(items)} trials, capacity {capacity / 100:.0f} %; CP-SAT "
              f"{best.status}, proven bound {bound / 100:.1f} %, its own gap to the bound "
              f"{100 * (bound - best.objective) / bound:.2f} %")
        print(f"{'policy':<9}{'placed':>7}{'occupancy':>11}{'time':>12}{'x FF':>8}"
              f"{'gap to CP-SAT':>15}")
        ff_time = median_time(make_policy("ff"), items, view, args.repeats)
        for name in ("optimal", "ff", "ffd", "wf", "wfd"):
            if name == "optimal":
                plan, t = best, opt_time
            else:
                policy = make_policy(name)
                plan = policy.place(items, view)
                check_plan(items, view, plan)
                t = median_time(policy, items, view, args.repeats)
            gap = (best.objective - plan.objective) / best.objective
            shown = f"{t:.3f} s" if name == "optimal" else f"{t * 1000:.3f} ms"
            print(f"{name:<9}{len(plan.placements):>7}{100 * plan.objective / capacity:>10.2f}%"
                  f"{shown:>12}{t / ff_time:>8.2f}{100 * gap:>15.2f}%")


if __name__ == "__main__":
    main()
