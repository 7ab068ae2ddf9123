"""`hypersack plan`: one scheduling decision on an empty cluster, dry run."""

from __future__ import annotations

import argparse
from typing import Any

from hypersack.cli.main import emit, load_inputs
from hypersack.core.clock import ManualClock
from hypersack.core.types import TrialState
from hypersack.orchestrator.commands import LaunchGroup, ProfileWorkload, launched
from hypersack.orchestrator.events import NodeJoined, StudySubmitted
from hypersack.orchestrator.orchestrator import Orchestrator
from hypersack.policies.base import COMPUTE_SCALE, CORE_SCALE, Need
from hypersack.policies.plans import why_unplaced
from hypersack.policies.registry import make_policy
from hypersack.store.memory import MemoryStore


def _need(n: Need) -> dict[str, float]:
    return {"compute_pct": n.compute / COMPUTE_SCALE, "memory_mib": n.memory,
            "cores": n.cores / CORE_SCALE}


def decide(args: argparse.Namespace) -> dict[str, Any]:
    space, cluster, profiles, config = load_inputs(args)
    store = MemoryStore()
    for p in profiles:
        store.put_profile(p)
    orch = Orchestrator(store, ManualClock(0.0), config)
    for node in cluster.nodes:
        orch.handle(NodeJoined(node))
    commands = orch.handle(StudySubmitted(space))
    study = orch.studies()[-1]
    # One decision, in rounds where fused groups that did not fit were cut narrower.
    rounds = [d for d in orch.decisions if d.study_id == study.id]
    decision = rounds[0] if rounds else None
    launches = {c.trial_id: c for c in launched(commands)}
    group_of = {m.trial_id: (c.group_id, len(c.members)) for c in commands
                if isinstance(c, LaunchGroup) for m in c.members}
    trials = orch.trials(study.id)
    arch_of = {(n.name, g.index): g.arch for n in cluster.nodes for g in n.gpus}
    items = {it.id: it for d in rounds for it in d.batch}
    round_of = {it.id: d for d in rounds for it in d.batch}
    placements = []
    for t in trials:
        c = launches.get(t.id)
        if c is not None:
            group_id, width = group_of.get(t.id, ("", 1))
            placements.append({"trial": t.id, "node": c.node, "gpu": c.gpu_index,
                               "arch": arch_of[c.node, c.gpu_index], "params": t.params,
                               "demand": c.demand.model_dump(), "fused_group": group_id,
                               "fusion_width": width})
    # The orchestrator passes the policy only as many trials of a workload as could fit;
    # the others share the reason of the first of their workload that did not, or, when
    # all it passed were placed, have no room left.
    unplaced: dict[Any, Any] = {}
    passed: dict[Any, Any] = {}
    for t in trials:
        it = items.get(t.id)
        if it is not None:
            group = (t.key, t.memory_override_mib)
            passed.setdefault(group, it)
            if t.id not in launches:
                unplaced.setdefault(group, it)
    pending = []
    for t in trials:
        if t.id in launches:
            continue
        item = items.get(t.id)
        group = (t.key, t.memory_override_mib)
        if item is None and t.state == TrialState.PENDING and decision is not None:
            item = unplaced.get(group)
            if item is None and group in passed:
                pending.append({"trial": t.id, "state": t.state.value, "params": t.params,
                                "demands": {a: _need(n) for a, n in passed[group].needs.items()},
                                "reason": f"no room left for more trials of {t.key.label()}"})
                continue
        if t.state == TrialState.PROFILING:
            reason = f"waiting for a profile of {t.key.label()}"
        elif item is not None and item.id in round_of:
            d = round_of[item.id]
            reason = why_unplaced(item, d.view, d.plan, d.batch)
        else:
            reason = t.reason or "no profile on any architecture in the cluster"
        pending.append({"trial": t.id, "state": t.state.value, "params": t.params,
                        "demands": {a: _need(n) for a, n in item.needs.items()} if item else {},
                        "reason": reason})
    gpus = []
    total_cap = total_used = 0
    if decision is not None:
        used: dict[tuple[str, int], list[int]] = {}
        for d in rounds:
            for p in d.plan.placements:
                arch = arch_of[p.node, p.gpu_index]
                need = items[p.item_id].needs[arch]
                u = used.setdefault((p.node, p.gpu_index), [0, 0, 0])
                u[1] += need.compute
                u[2] += need.memory
        for c in launches.values():
            used.setdefault((c.node, c.gpu_index), [0, 0, 0])[0] += 1
        for node in decision.view.nodes:
            for g in node.gpus:
                count, compute, memory = used.get((node.name, g.index), [0, 0, 0])
                total_cap += g.total_compute
                total_used += compute
                gpus.append({"node": node.name, "gpu": g.index, "arch": g.arch, "trials": count,
                             "compute_pct": compute / COMPUTE_SCALE,
                             "capacity_pct": g.total_compute / COMPUTE_SCALE,
                             "occupancy": round(compute / g.total_compute, 4)
                             if g.total_compute else 0,
                             "memory_mib": memory, "memory_capacity_mib": g.total_memory})
    result: dict[str, Any] = {
        "study": study.id, "trials": len(trials),
        "policy": decision.policy if decision else config.policy,
        "placed": len(placements), "pending": len(pending),
        "occupancy": round(total_used / total_cap, 4) if total_cap else 0.0,
        "solve_time_ms": round(sum(d.solve_time_s for d in rounds) * 1000, 4),
        "fused_groups": len({g for g, _ in group_of.values()}),
        "profiles_needed": sorted({t.key.label() for t in trials
                                   if t.state == TrialState.PROFILING}),
        "profile_jobs_started": [{"workload": c.key.label(), "arch": c.arch, "node": c.node,
                                  "gpu": c.gpu_index} for c in commands
                                 if isinstance(c, ProfileWorkload)],
        "placements": placements, "pending_trials": pending, "gpus": gpus,
    }
    if getattr(args, "compare", None) and decision is not None:
        options = dict(config.policy_options.get("optimal", {}))
        ref = make_policy("optimal", **options).place(decision.batch, decision.view)
        ours = decision.plan.objective
        best = ref.objective if ref.status == "OPTIMAL" else (ref.bound or ref.objective)
        result["compare"] = {
            "policy": "optimal", "status": ref.status,
            "objective_pct": ref.objective / COMPUTE_SCALE,
            "bound_pct": (ref.bound or 0) / COMPUTE_SCALE,
            "ours_pct": ours / COMPUTE_SCALE,
            "occupancy": round(ref.objective / total_cap, 4) if total_cap else 0.0,
            "gap_to_optimal": round((best - ours) / best, 6) if best else 0.0,
            "solve_time_s": round(ref.solve_time_s, 3),
        }
    return result


def run_plan(args: argparse.Namespace) -> int:
    result = decide(args)
    if args.json:
        emit(result)
        return 0
    print(f"study {result['study']}: {result['trials']} trials, policy {result['policy']}, "
          f"solved in {result['solve_time_ms']:.3f} ms")
    print(f"placed {result['placed']}, pending {result['pending']}, "
          f"occupancy {100 * result['occupancy']:.1f} % of scaled compute")
    if result["profiles_needed"]:
        print(f"needs profiling first: {len(result['profiles_needed'])} workloads")
    print(f"\n{'GPU':<14}{'arch':<7}{'trials':>7}{'compute %':>11}{'of':>7}{'memory MiB':>12}"
          f"{'occupancy':>11}")
    for g in result["gpus"]:
        print(f"{g['node'] + ':' + str(g['gpu']):<14}{g['arch']:<7}{g['trials']:>7}"
              f"{g['compute_pct']:>11.1f}{g['capacity_pct']:>7.0f}{g['memory_mib']:>12}"
              f"{100 * g['occupancy']:>10.1f}%")
    if result["fused_groups"]:
        print(f"\n{result['fused_groups']} fused groups (a member's demand is its share of "
              f"its group's)")
    print(f"\n{'trial':<18}{'GPU':<14}{'compute %':>10}{'memory MiB':>12}{'cores':>7}"
          f"{'fused':>7}  params")
    for p in result["placements"]:
        d = p["demand"]
        params = " ".join(f"{k}={v}" for k, v in p["params"].items())
        fused = f"x{p['fusion_width']}" if p["fused_group"] else "-"
        print(f"{p['trial']:<18}{p['node'] + ':' + str(p['gpu']):<14}{d['compute_pct']:>10.1f}"
              f"{d['memory_mib']:>12}{d['cores']:>7.1f}{fused:>7}  {params}")
    if result["pending_trials"]:
        print(f"\npending ({len(result['pending_trials'])}):")
        for p in result["pending_trials"]:
            print(f"  {p['trial']}: {p['reason']}")
    if "compare" in result:
        c = result["compare"]
        print(f"\noptimal (CP-SAT, {c['status']}, {c['solve_time_s']} s): "
              f"occupancy {100 * c['occupancy']:.2f} %; gap of {result['policy']}: "
              f"{100 * c['gap_to_optimal']:.2f} %")
    return 0
