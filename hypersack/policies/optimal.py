"""The optimality reference: the GPU Assignment Problem as an OR-Tools CP-SAT model.

Items with identical needs are interchangeable, so the model counts them per GPU
instead of giving every (item, GPU) pair a boolean: n[k, g] is how many items of class
k go to GPU g. This is the same problem (each item at most once; per GPU compute and
memory; per node cores; maximize placed compute) without the symmetry that makes the
boolean model slow. The objective is the placed items' values (work placed, the same
on every architecture; see `base`). Items of a class are then handed out in order,
longest run first.
The best heuristic plan (pack and the paper's greedy rules) is given to the solver
as a hint, so a time-limited solve is never worse than the heuristics. It uses every
core unless `workers` says otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from hypersack.core.cluster import usable_cores
from hypersack.policies.base import ClusterView, Flat, Item, Need, Placement, Plan, classes
from hypersack.policies.compose import ComposedPolicy
from hypersack.policies.greedy import GreedyPolicy


class OptimalPolicy:
    name = "optimal"

    def __init__(self, *, time_limit_s: float = 10.0, workers: int = 0, seed: int = 0) -> None:
        if time_limit_s <= 0:
            raise ValueError(f"time_limit_s must be > 0 (got {time_limit_s})")
        if workers < 0:
            raise ValueError(f"workers must be >= 0 (got {workers}; 0: every core)")
        self.time_limit_s = float(time_limit_s)
        # 0: every core this process may run on.
        self.workers = int(workers) or usable_cores()
        self.seed = int(seed)

    def place(self, items: Sequence[Item], cluster: ClusterView) -> Plan:
        from ortools.sat.python import cp_model

        start = time.perf_counter()
        flat = Flat(cluster)
        n_gpus = len(flat)
        # Classes of interchangeable items, in first-seen order; members longest first.
        reps, members = classes(items)

        model = cp_model.CpModel()
        count: dict[tuple[int, int], cp_model.IntVar] = {}
        for k, rep in enumerate(reps):
            needs = rep.needs
            size = len(members[k])
            for g in range(n_gpus):
                need = needs.get(flat.arch[g])
                if need is None:
                    continue
                cap = min(size, flat.slots[g])
                for have, want in ((flat.compute[g], need.compute),
                                   (flat.memory[g], need.memory),
                                   (flat.node_cores[flat.node_of[g]], need.cores)):
                    if want > 0:
                        cap = min(cap, have // want)
                if cap > 0:
                    count[k, g] = model.new_int_var(0, cap, f"n_{k}_{g}")
        objective_terms = []
        for k, its in enumerate(members):
            vars_k = [v for (kk, _), v in count.items() if kk == k]
            if vars_k:
                model.add(sum(vars_k) <= len(its))
        by_gpu: dict[int, list[tuple[Need, cp_model.IntVar]]] = {}
        for (k, g), var in count.items():
            need = reps[k].needs[flat.arch[g]]
            by_gpu.setdefault(g, []).append((need, var))
            objective_terms.append(reps[k].value * var)
        by_node: dict[int, list[tuple[Need, cp_model.IntVar]]] = {}
        for g, terms in by_gpu.items():
            model.add(sum(n.compute * v for n, v in terms) <= flat.compute[g])
            model.add(sum(n.memory * v for n, v in terms) <= flat.memory[g])
            if flat.slots[g] < len(items):
                model.add(sum(v for _, v in terms) <= flat.slots[g])
            by_node.setdefault(flat.node_of[g], []).extend(terms)
        for ni, terms in by_node.items():
            model.add(sum(n.cores * v for n, v in terms) <= flat.node_cores[ni])
        model.maximize(sum(objective_terms))

        # The best of pack and the four greedy rules is the hint (and the fallback).
        hint = max([ComposedPolicy().place(items, cluster)]
                   + [GreedyPolicy(n, decreasing=d, worst=w).place(items, cluster)
                      for n, d, w in (("wfd", True, True), ("ffd", True, False),
                                      ("wf", False, True), ("ff", False, False))],
                   key=lambda plan: plan.objective)
        gpu_of = {(flat.node_names[flat.node_of[g]], flat.index[g]): g for g in range(n_gpus)}
        key_of = {i: k for k, its in enumerate(members) for i in its}
        index_of = {it.id: i for i, it in enumerate(items)}
        hinted: dict[tuple[int, int], int] = {}
        for p in hint.placements:
            kg = (key_of[index_of[p.item_id]], gpu_of[p.node, p.gpu_index])
            hinted[kg] = hinted.get(kg, 0) + 1
        for kg, var in count.items():
            model.add_hint(var, hinted.get(kg, 0))

        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = self.time_limit_s
        solver.parameters.num_workers = self.workers
        solver.parameters.random_seed = self.seed
        status = solver.solve(model)
        status_name = solver.status_name(status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            # No solution in time (cannot happen with the hint, but never place blindly).
            return Plan(placements=hint.placements, unplaced=hint.unplaced,
                        solve_time_s=time.perf_counter() - start, objective=hint.objective,
                        status=f"{status_name} (fell back to the best heuristic)")

        placements: list[Placement] = []
        placed: set[int] = set()
        objective = 0
        for k, its in enumerate(members):
            handout = iter(its)
            for g in range(n_gpus):
                chosen = count.get((k, g))
                if chosen is None:
                    continue
                for _ in range(solver.value(chosen)):
                    i = next(handout)
                    placements.append(flat.placement(items[i].id, g))
                    placed.add(i)
                    objective += items[i].value
        unplaced = tuple(it.id for i, it in enumerate(items) if i not in placed)
        return Plan(placements=tuple(placements), unplaced=unplaced,
                    solve_time_s=time.perf_counter() - start, objective=objective,
                    status=status_name, bound=int(solver.best_objective_bound),
                    info={"hint_objective": float(hint.objective),
                          "solver_wall_s": solver.wall_time})
