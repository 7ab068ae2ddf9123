"""What every plan must be, whichever policy made it (`check_plan`: a plug-in's too, before
anything of it is launched), and a person's answer to why an item of it stayed unplaced
(`why_unplaced`, for `hypersack plan` and `why`)."""

from __future__ import annotations

from collections.abc import Sequence

from hypersack.core.bounds import is_number
from hypersack.policies.base import (
    COMPUTE_SCALE,
    CORE_SCALE,
    ClusterView,
    Flat,
    GpuBin,
    Item,
    Need,
    NodeBin,
    Placement,
    Plan,
)


class PlanError(AssertionError):
    """A plan breaks an invariant every policy keeps (over a capacity, an item twice, an
    unknown GPU...). Raised explicitly, not by `assert`, so the check holds under
    `python -O` too: nothing of such a plan is launched."""


def check_plan(items: Sequence[Item], cluster: ClusterView, plan: Plan) -> None:
    """The invariants every policy keeps, whichever policy (a plug-in too) made the plan:
    raises PlanError naming the first one broken."""
    if not isinstance(plan, Plan):
        raise PlanError(f"a policy returned {type(plan).__name__}, not a Plan")
    if not isinstance(plan.placements, tuple) or not isinstance(plan.unplaced, tuple):
        raise PlanError("a plan's placements and unplaced must be tuples")
    for p in plan.placements:
        if not (isinstance(p, Placement) and isinstance(p.item_id, str)
                and isinstance(p.node, str) and type(p.gpu_index) is int):
            raise PlanError(f"malformed placement {p!r}")
    if not all(isinstance(i, str) for i in plan.unplaced):
        raise PlanError("unplaced item ids must be strings")
    if type(plan.objective) is not int:
        raise PlanError(f"objective {plan.objective!r} is not an integer")
    if plan.bound is not None and type(plan.bound) is not int:
        raise PlanError(f"bound {plan.bound!r} is not an integer")
    if not isinstance(plan.status, str):
        raise PlanError(f"status {plan.status!r} is not a string")
    t = plan.solve_time_s
    if not (is_number(t) and t >= 0):
        raise PlanError(f"solve time {t!r} is not a finite number of seconds")
    by_id = {it.id: it for it in items}
    if len(by_id) != len(items):
        raise PlanError("item ids must be unique")
    placed = [p.item_id for p in plan.placements]
    if len(set(placed)) != len(placed):
        raise PlanError("an item was placed twice")
    if set(placed) | set(plan.unplaced) != set(by_id):
        raise PlanError("every item is placed or unplaced, and no other")
    if set(placed) & set(plan.unplaced):
        raise PlanError("an item is both placed and unplaced")
    # Only the GPUs and nodes the placements touch: any other holds what the view says,
    # which is never below zero (at a thousand nodes, walking all made this check a
    # quarter of a decision).
    on_gpu: dict[tuple[str, int], tuple[GpuBin, list[int]]] = {}  # compute, memory, items
    on_node: dict[str, tuple[NodeBin, list[int]]] = {}  # cores
    objective = 0
    for p in plan.placements:
        node = cluster.node_named(p.node)
        gpus = node.columns.indexes if node is not None else ()
        if node is None or p.gpu_index not in gpus:
            raise PlanError(f"placement on unknown GPU {p.node}:{p.gpu_index}")
        gpu = node.gpus[gpus.index(p.gpu_index)]
        need = by_id[p.item_id].needs.get(gpu.arch)
        if need is None:
            raise PlanError(f"{p.item_id} placed on {gpu.arch} without a need for it")
        held = on_gpu.setdefault((p.node, p.gpu_index), (gpu, [0, 0, 0]))[1]
        held[0] += need.compute
        held[1] += need.memory
        held[2] += 1
        on_node.setdefault(p.node, (node, [0]))[1][0] += need.cores
        objective += by_id[p.item_id].value
    for (node_name, index), (gpu, (compute, memory, count)) in on_gpu.items():
        name = f"GPU {node_name}:{index}"
        if gpu.compute < compute:
            raise PlanError(f"{name} over its scaled compute")
        if gpu.memory < memory:
            raise PlanError(f"{name} over its memory")
        if gpu.slots is not None and gpu.slots < count:
            raise PlanError(f"{name} over its slots")
    for node_name, (node, (cores,)) in on_node.items():
        if node.cores < cores:
            raise PlanError(f"node {node_name} over its cores")
    if objective != plan.objective:
        raise PlanError(f"objective {plan.objective} != placed value {objective}")


def why_unplaced(item: Item, cluster: ClusterView, after: Plan, items: Sequence[Item]) -> str:
    """A person's answer to 'why is this trial still pending?' after a plan."""
    gpus = [(n, g) for n in cluster.nodes for g in n.gpus]
    usable = [(n, g) for n, g in gpus if g.arch in item.needs]
    if not usable:
        archs = sorted({g.arch for _, g in gpus})
        return (f"no profile for the cluster's architectures {archs}"
                if archs else "no GPU in the cluster")

    def describe(need: Need) -> str:
        return (f"{need.compute / COMPUTE_SCALE:g}% compute, {need.memory} MiB, "
                f"{need.cores / CORE_SCALE:g} cores")

    never = True
    for nb, gb in usable:
        want = item.needs[gb.arch]
        if (want.compute <= gb.full_compute and want.memory <= gb.full_memory
                and want.cores <= nb.full_cores):
            never = False
    if never:
        first = item.needs[usable[0][1].arch]
        return f"needs {describe(first)}: more than any GPU or node offers when empty"
    flat = Flat(cluster)
    by_id = {it.id: it for it in items}
    where = {(flat.node_names[flat.node_of[g]], flat.index[g]): g for g in range(len(flat))}
    for p in after.placements:
        g = where[(p.node, p.gpu_index)]
        flat.take(g, by_id[p.item_id].needs[flat.arch[g]])
    short = {"compute": 0, "memory": 0, "cores": 0, "slots": 0}
    for g in range(len(flat)):
        need: Need | None = item.needs.get(flat.arch[g])
        if need is None:
            continue
        if flat.slots[g] <= 0:
            short["slots"] += 1
        elif flat.compute[g] < need.compute:
            short["compute"] += 1
        elif flat.memory[g] < need.memory:
            short["memory"] += 1
        elif flat.node_cores[flat.node_of[g]] < need.cores:
            short["cores"] += 1
    parts = [f"{v} short of {k}" for k, v in short.items() if v]
    return f"waiting for capacity: needs {describe(item.needs[usable[0][1].arch])}; GPUs " + (
        ", ".join(parts) if parts else "fit but the policy did not choose one")
