"""`hypersack simulate`: a study on a simulated cluster, against one trial per GPU."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from typing import Any

from hypersack.cli.main import _floats, emit, load_inputs, out_path, with_ratio
from hypersack.orchestrator import fusion
from hypersack.sim.fused import with_fused
from hypersack.sim.gantt import gantt_svg
from hypersack.sim.interference import Interference
from hypersack.sim.results import SimResult
from hypersack.sim.simulator import Simulation


def _per_gpu(result: SimResult) -> list[dict[str, Any]]:
    rows = []
    for node, index, arch in result.gpus:
        segs = [s for s in result.timeline if s.node == node and s.gpu_index == index
                and s.outcome != "PROFILE"]
        busy = _union(sorted((s.start_s, s.end_s) for s in segs))
        rows.append({"node": node, "gpu": index, "arch": arch,
                     "trials": sum(s.members for s in segs), "fused_groups": sum(
                         s.members > 1 for s in segs),
                     "busy_s": round(busy, 3),
                     "segments": [{"trial": s.trial_id, "start_s": round(s.start_s, 3),
                                   "end_s": round(s.end_s, 3), "outcome": s.outcome,
                                   "members": s.members}
                                  for s in segs]})
    return rows


def _union(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in intervals:
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def run_simulate(args: argparse.Namespace) -> int:
    space, cluster, profiles, config = load_inputs(args)
    # Fused widths the profiles lack are estimated from each workload alone (sim.fused).
    profiles = with_fused(profiles)
    interference = Interference()
    if args.contention is not None:
        if not 0 <= args.contention <= 100:
            from hypersack.core.errors import InvalidInput

            raise InvalidInput("--contention must be a number in [0, 100]")
        interference = replace(interference, contention=args.contention)
    history: list[Any] | None = [] if args.cold else None

    def simulate(cfg: Any, sp: Any) -> SimResult:
        return Simulation(sp, cluster, profiles, config=cfg, history=history,
                          interference=interference).run()

    # A bad --sweep is refused before any simulation runs or anything is printed.
    sweep = _floats(args.sweep, "--sweep") if args.sweep else []
    baseline = simulate(replace(config, exclusive=True), space)
    if sweep:
        rows = []
        if not args.json:
            print(f"baseline (one trial per GPU): {baseline.makespan_s:.1f} s")
            print(f"{'ratio':>6}{'makespan s':>12}{'speedup':>9}{'occupancy':>11}")
        for ratio in sweep:
            cfg, sp = with_ratio(config, space, cluster, ratio)
            r = simulate(cfg, sp)
            row = {"ratio": ratio, "makespan_s": round(r.makespan_s, 3),
                   "speedup": round(baseline.makespan_s / r.makespan_s, 4),
                   "mean_occupancy": round(r.mean_occupancy, 4)}
            rows.append(row)
            if not args.json:
                print(f"{ratio:>6g}{r.makespan_s:>12.1f}{row['speedup']:>8.2f}x"
                      f"{100 * r.mean_occupancy:>10.1f}%", flush=True)
        if args.json:
            emit({"policy": config.policy, "baseline_makespan_s": round(baseline.makespan_s, 3),
                  "sweep": rows})
        return 0

    result = simulate(config, space)
    speedup = baseline.makespan_s / result.makespan_s if result.makespan_s else 0.0
    # Exclusive, packed and packed + fused side by side, where the study fuses.
    fuses = config.fusion and fusion.enabled(space)
    packed = simulate(replace(config, fusion=False), space) if fuses else result
    packed_speedup = baseline.makespan_s / packed.makespan_s if packed.makespan_s else 0.0
    groups = sum(s.members > 1 for s in result.timeline if s.outcome != "PROFILE")
    if args.gantt:
        path = out_path(args.gantt)
        path.write_text(gantt_svg(result.timeline, result.gpus, result.makespan_s,
                                  title=f"{space.name} on {cluster.gpu_count()} GPUs, "
                                        f"{config.policy}: {speedup:.2f}x",
                                  occupancy=result.occupancy, baseline_s=baseline.makespan_s))
    if args.json:
        emit({"policy": config.policy, "makespan_s": round(result.makespan_s, 3),
              "baseline_makespan_s": round(baseline.makespan_s, 3),
              "speedup": round(speedup, 4), **{k: v for k, v in result.summary().items()
                                                if k != "makespan_s"},
              "baseline_mean_occupancy": round(baseline.mean_occupancy, 4),
              "fusion": fuses, "fused_groups": groups,
              "packed_makespan_s": round(packed.makespan_s, 3),
              "packed_speedup": round(packed_speedup, 4),
              "rules": result.rules, "gpus": _per_gpu(result)})
    else:
        print(f"{space.name}: {result.trials} trials on {cluster.gpu_count()} GPUs, "
              f"policy {config.policy}")
        for rule in result.rules.values():
            print(f"  {rule}")
        print(f"{'':<20}{'makespan s':>12}{'speedup':>9}")
        print(f"{'one trial per GPU':<20}{baseline.makespan_s:>12.1f}{1.0:>8.2f}x")
        print(f"{'packed':<20}{packed.makespan_s:>12.1f}{packed_speedup:>8.2f}x")
        if fuses:
            print(f"{'packed + fused':<20}{result.makespan_s:>12.1f}{speedup:>8.2f}x"
                  f"   ({groups} fused groups)")
        print(f"mean occupancy      {100 * result.mean_occupancy:10.1f} % of scaled compute "
              f"(baseline {100 * baseline.mean_occupancy:.1f} %)")
        print(f"completed / failed  {result.completed} / {result.failed}")
        print(f"decisions           {result.decisions} "
              f"({1000 * result.decision_time_s:.1f} ms in total)")
        if result.profile_jobs:
            print(f"profile jobs        {result.profile_jobs}")
        print(f"{'idle, trials fit':<20}{result.idle_fit_s:.1f} GPU-s (GPUs holding nothing "
              "while a waiting trial fit them)")
        print(f"\n{'GPU':<14}{'arch':<7}{'trials':>7}{'busy s':>10}")
        for g in _per_gpu(result):
            print(f"{g['node'] + ':' + str(g['gpu']):<14}{g['arch']:<7}{g['trials']:>7}"
                  f"{g['busy_s']:>10.1f}")
        if args.gantt:
            print(f"\nGantt chart: {args.gantt}")
    if result.stuck:
        print("warning: the study did not finish (trials that fit no GPU?)", file=sys.stderr)
        return 1
    return 0
