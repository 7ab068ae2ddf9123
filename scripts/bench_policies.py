#!/usr/bin/env python3
"""The HyperSack paper's Table III, extended: per policy, the work placed as a share of
the CP-SAT optimum (or of its best plan where CP-SAT did not prove optimality within
the time limit; that plan's proven gap to the bound is printed beside it) and the
median time to solve, on

- the first decision of SP3 on 4 A100 and SP4 on 16 A100 (ratio 3, example estimated
  profiles, trials alone as the paper packs them);
- heterogeneous instances (A100-40GB and H100-80GB nodes mixed, ratios 3 and 2.5;
  compute-, memory- and CPU-bound workload mixes and one of all three), several seeds;
- the scale points 384 trials x 16 GPUs and 10,000 x 1,000 (no CP-SAT there: times
  only, and work placed relative to `wfd`).

Times are also given relative to `ff` measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from _instances import EXAMPLES, MIXES, first_decision, heterogeneous

from hypersack.policies import kernels, make_policy
from hypersack.policies.base import Item
from hypersack.policies.plans import check_plan

# label, policy, options: pack at its defaults (GPUs re-solved in pairs, then kicks, its
# knapsacks compiled), the same as plain Python (the fallback where numba is missing),
# capped at 5 ms, without the kicks (pack's default before them), with one GPU's
# knapsack only (improve: repack, pack's default before the compiled kernels) and
# without the LP start; auto.
PLAIN = "plain kernels"
HEURISTICS: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("ff", "ff", {}), ("ffd", "ffd", {}), ("wf", "wf", {}), ("wfd", "wfd", {}),
    ("eft", "eft", {}), ("pack@5ms", "pack", {"budget_ms": 5.0}),
    ("pack-nokicks", "pack", {"kick_effort": 0}), ("pack-repack", "pack", {"improve": "repack"}),
    ("pack-nolp", "pack", {"improve": "repack", "lp": False}),
    ("pack", "pack", {}), ("pack-plain", "pack", {PLAIN: True}), ("auto", "auto", {}))


def policy_for(name: str, options: dict[str, object]) -> object:
    """The policy; with PLAIN set, one whose decisions run the plain kernels."""
    options = dict(options)
    if not options.pop(PLAIN, False):
        return make_policy(name, **options)
    inner = make_policy(name, **options)

    class Plain:
        def place(self, items: list, view: object) -> object:
            saved = dict(kernels._compiled)
            kernels._compiled.clear()
            try:
                return inner.place(items, view)  # type: ignore[attr-defined]
            finally:
                kernels._compiled.update(saved)
    return Plain()


def median_time(policy: object, items: list, view: object, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        policy.place(items, view)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def quality(title: str, items: list[Item], view: object, args: argparse.Namespace,
            summary: dict[str, list[float]]) -> None:
    optimal = make_policy("optimal", time_limit_s=args.time_limit, workers=args.workers)
    best = optimal.place(items, view)  # type: ignore[arg-type]
    check_plan(items, view, best)  # type: ignore[arg-type]
    ref = best.objective
    gap = 100 * (best.gap() or 0.0)
    ff_time = median_time(make_policy("ff"), items, view, args.repeats)
    row = [f"{title:<14}{len(items):>6}  {best.status:<9}{best.solve_time_s:>7.1f}s"
           f"{gap:>6.2f}%"]
    for label, name, options in HEURISTICS:
        policy = policy_for(name, options)
        plan = policy.place(items, view)  # type: ignore[attr-defined]
        check_plan(items, view, plan)  # type: ignore[arg-type]
        t = median_time(policy, items, view, args.repeats)
        share = 100 * plan.objective / ref
        summary.setdefault(label, []).append(share)
        row.append(f"{share:>7.2f}% {t * 1000:>6.2f}ms {t / ff_time:>4.1f}x")
    summary.setdefault("optimal", []).append(100 * best.objective / ref)
    print("".join(row), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--time-limit", type=float, default=20.0, help="CP-SAT seconds")
    parser.add_argument("--workers", type=int, default=0, help="CP-SAT workers (0: all)")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per heterogeneous mix")
    args = parser.parse_args()
    # Compiled before any timing (about 9 s the first time, then loaded from numba's
    # cache); without numba, "pack" runs the plain kernels too.
    print(f"compiled kernels: {kernels.compile_now()}")
    print("work placed as % of the CP-SAT optimum (or its best plan, whose proven gap to "
          "the bound is given), median solve time, time / ff's")
    print(f"{'instance':<14}{'items':>6}  {'CP-SAT':<9}{'time':>8}{'gap':>7}"
          + "".join(f"{label:>24}" for label, _, _ in HEURISTICS))
    summary: dict[str, list[float]] = {}
    for title, space, cluster in (("SP3 4xA100", "sp3.yaml", "1x4xA100-80GB@88"),
                                  ("SP4 16xA100", "sp4.yaml", "4x4xA100-80GB@88")):
        items, view = first_decision(EXAMPLES / space, cluster)
        quality(title, items, view, args, summary)
    for mix in MIXES:
        for seed in range(args.seeds):
            items, view = heterogeneous(mix, seed)
            quality(f"{mix} s{seed}", items, view, args, summary)
    print("\nover all instances: min / mean % of the optimum")
    for name, shares in summary.items():
        print(f"  {name:<8}{min(shares):>8.2f}{statistics.mean(shares):>8.2f}")

    print("\nscale: median solve time (work placed relative to wfd)")
    from bench_scale import instance

    for trials, gpus in ((384, 16), (10_000, 1_000)):
        items, view = instance(trials, gpus)
        ref = make_policy("wfd").place(items, view).objective
        cells = []
        for label, name, options in HEURISTICS:
            policy = policy_for(name, options)
            plan = policy.place(items, view)  # type: ignore[attr-defined]
            check_plan(items, view, plan)
            t = median_time(policy, items, view, max(3, args.repeats // 3))
            cells.append(f"{label} {t * 1000:.2f} ms ({plan.objective / ref:.3f})")
        print(f"  {trials:>6} x {gpus:<5} " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
