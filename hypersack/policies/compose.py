"""Composed policies: an order, a score for choosing the GPU, and an improvement stage.

    order    which item is placed next
             given     submission order
             longest   longest expected run time first (the paper's "decreasing", D)
             value     most work first
             density   most work per unit of the scarce resources first: each resource
                       (compute, memory, the node's cores) weighted by how scarce it is
                       in this decision (what the items ask of it over what is free),
                       each normalized by one GPU's capacity (a node's cores by its
                       share per GPU)
    score    which GPU takes it, among those where it fits
             first     the first in node and GPU order
             worst     the most free capacity, normalized and weighted as above (so an
                       empty A100 at ratio 3 and an empty H100 at 2.5 are both "empty")
             best      the least free capacity left after placing it
             dot       the largest dot product of its need and the GPU's free capacity
             norm      the smallest norm of what is left after placing it
    improve  after the greedy pass, until the decision has taken `budget_ms` (the
             greedy pass always completes; the local search uses what is left)
             none      nothing
             swap      local search: place what now fits, and swap a placed item for a
                       pending one of more value where that fits

Items with identical needs and value form a class; a class's GPUs are kept in a heap by
score, so a decision costs about (classes x GPUs + items) x log(GPUs), not items x GPUs.
The heap is lazy: a GPU whose score changed since it was pushed is pushed again with its
new score when it comes out, and the choice is a heuristic's, never checked against a
rescan. Every plan a policy returns is checked against the capacities by the caller.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from hypersack.policies.base import ClusterView, Flat, Item, Need, Placement, Plan, classes

Order = Literal["given", "longest", "value", "density"]
Score = Literal["first", "worst", "best", "dot", "norm"]
Improve = Literal["none", "swap"]


class ComposedOptions(BaseModel):
    """A composed policy's options (`policy_options` in the server's settings, or
    `--policy-option key=value`)."""

    model_config = ConfigDict(extra="forbid")
    order: Order = "density"
    score: Score = "best"
    improve: Improve = "swap"
    budget_ms: float = Field(default=4.0, ge=0.0, le=60_000.0)


class _Scales:
    """Per GPU: the capacities that normalize a need, times each resource's weight."""

    def __init__(self, cluster: ClusterView, flat: Flat, items: Sequence[Item]) -> None:
        wc: list[float] = []
        wm: list[float] = []
        wk: list[float] = []
        for node in cluster.nodes:
            share = node.full_cores / max(1, len(node.gpus))
            for g in node.gpus:
                wc.append(1.0 / max(1, g.full_compute))
                wm.append(1.0 / max(1, g.full_memory))
                wk.append(1.0 / max(1.0, share))
        # Scarcity: what the items ask of a resource (on the architecture where they ask
        # least compute) over what is free; a resource nobody asks for weighs nothing.
        free = (sum(flat.compute), sum(flat.memory), sum(flat.node_cores))
        asked = [0, 0, 0]
        for it in items:
            if it.needs:
                n = min(it.needs.values(), key=lambda x: x.compute)
                asked[0] += n.compute
                asked[1] += n.memory
                asked[2] += n.cores
        weight = [min(4.0, a / f) if f > 0 else (4.0 if a else 0.0)
                  for a, f in zip(asked, free, strict=True)]
        weight = [max(w, 0.01) for w in weight]
        self.c = [w * weight[0] for w in wc]
        self.m = [w * weight[1] for w in wm]
        self.k = [w * weight[2] for w in wk]

    def size(self, g: int, n: Need) -> float:
        return n.compute * self.c[g] + n.memory * self.m[g] + n.cores * self.k[g]


def _scorer(score: Score, flat: Flat, sc: _Scales) -> Callable[[int, Need], float]:
    """Lower is better."""
    node_of = flat.node_of

    def free(g: int) -> tuple[float, float, float]:
        return (flat.compute[g] * sc.c[g], flat.memory[g] * sc.m[g],
                flat.node_cores[node_of[g]] * sc.k[g])

    if score == "first":
        return lambda g, n: float(g)
    if score == "worst":
        return lambda g, n: -sum(free(g))
    if score == "best":
        return lambda g, n: sum(free(g)) - sc.size(g, n)
    if score == "dot":
        def dot(g: int, n: Need) -> float:
            c, m, k = free(g)
            return -(n.compute * sc.c[g] * c + n.memory * sc.m[g] * m + n.cores * sc.k[g] * k)
        return dot

    def norm(g: int, n: Need) -> float:
        c, m, k = free(g)
        return math.sqrt((c - n.compute * sc.c[g]) ** 2 + (m - n.memory * sc.m[g]) ** 2
                         + (k - n.cores * sc.k[g]) ** 2)
    return norm


class ComposedPolicy:
    def __init__(self, name: str = "pack", *, order: Order = "density", score: Score = "best",
                 improve: Improve = "swap", budget_ms: float = 4.0) -> None:
        opts = ComposedOptions(order=order, score=score, improve=improve, budget_ms=budget_ms)
        self.name = name
        self.order = opts.order
        self.score = opts.score
        self.improve = opts.improve
        self.budget_s = opts.budget_ms / 1000.0

    def place(self, items: Sequence[Item], cluster: ClusterView) -> Plan:
        start = time.perf_counter()
        flat = Flat(cluster)
        sc = _Scales(cluster, flat, items)
        # Within a class, the longest run first (it starts early and overlaps with the
        # short ones).
        reps, members = classes(items)
        order = self._class_order(reps, members, items, flat, sc)
        on: list[dict[int, list[int]]] = [{} for _ in range(len(flat))]
        left: list[list[int]] = [[] for _ in reps]
        scorer = _scorer(self.score, flat, sc)
        for c in order:
            self._greedy(c, reps[c], members[c], flat, scorer, on, left)
        if self.improve == "swap":
            _swap(reps, flat, on, left, start + self.budget_s)
        placements: list[Placement] = []
        objective = 0
        placed: set[int] = set()
        for g, by_class in enumerate(on):
            for c, its in by_class.items():
                for i in its:
                    placements.append(flat.placement(items[i].id, g))
                    placed.add(i)
                    objective += reps[c].value
        unplaced = tuple(items[i].id for c in order for i in members[c] if i not in placed)
        return Plan(placements=tuple(placements), unplaced=unplaced,
                    solve_time_s=time.perf_counter() - start, objective=objective)

    def _class_order(self, classes: list[Item], members: list[list[int]],
                     items: Sequence[Item], flat: Flat, sc: _Scales) -> list[int]:
        """Classes in the policy's order, ties in first-seen order."""
        first_gpu: dict[str, int] = {}
        for g, a in enumerate(flat.arch):
            first_gpu.setdefault(a, g)
        if self.order == "given":
            return list(range(len(classes)))
        if self.order == "longest":
            return sorted(range(len(classes)), key=lambda c: -items[members[c][0]].run_time_s)
        if self.order == "value":
            return sorted(range(len(classes)), key=lambda c: -classes[c].value)

        def density(c: int) -> float:
            sizes = [sc.size(first_gpu[a], n) for a, n in classes[c].needs.items()
                     if a in first_gpu]
            if not sizes:
                return -1.0
            return classes[c].value / max(min(sizes), 1e-12)
        return sorted(range(len(classes)), key=lambda c: (-density(c), -classes[c].value))

    @staticmethod
    def _greedy(c: int, cls: Item, its: list[int], flat: Flat,
                scorer: Callable[[int, Need], float], on: list[dict[int, list[int]]],
                left: list[list[int]]) -> None:
        """Place a class's items one at a time on the best-scoring GPU where they fit."""
        needs = cls.needs
        arch = flat.arch
        heap = [(scorer(g, needs[arch[g]]), g) for g in range(len(flat))
                if arch[g] in needs and flat.fits(g, needs[arch[g]])]
        heapq.heapify(heap)
        k = 0
        while k < len(its) and heap:
            key, g = heapq.heappop(heap)
            need = needs[arch[g]]
            if not flat.fits(g, need):
                continue
            now = scorer(g, need)
            if now != key:
                heapq.heappush(heap, (now, g))
                continue
            flat.take(g, need)
            on[g].setdefault(c, []).append(its[k])
            k += 1
            if flat.fits(g, need):
                heapq.heappush(heap, (scorer(g, need), g))
        left[c] = its[k:][::-1]  # pop() gives the longest first


def _swap(classes: list[Item], flat: Flat, on: list[dict[int, list[int]]],
          left: list[list[int]], deadline: float) -> None:
    """Local search until nothing improves or the deadline: on each GPU, place pending
    items that now fit (most value first), then swap a placed item for a pending one of
    more value where that fits once the placed one is gone. Every move gains value, so
    it ends."""
    by_value = sorted(range(len(classes)), key=lambda c: -classes[c].value)
    node_of = flat.node_of
    improved = True
    while improved:
        improved = False
        for g in range(len(flat)):
            if time.perf_counter() > deadline:
                return
            a = flat.arch[g]
            for j in by_value:
                nj = classes[j].needs.get(a)
                while nj is not None and left[j] and flat.fits(g, nj):
                    flat.take(g, nj)
                    on[g].setdefault(j, []).append(left[j].pop())
                    improved = True
            swapped = True
            while swapped:
                swapped = False
                for i in sorted((c for c, its in on[g].items() if its),
                                key=lambda c: classes[c].value):
                    ni = classes[i].needs[a]
                    for j in by_value:
                        if classes[j].value <= classes[i].value:
                            break
                        nj = classes[j].needs.get(a)
                        if (nj is None or not left[j]
                                or flat.compute[g] + ni.compute < nj.compute
                                or flat.memory[g] + ni.memory < nj.memory
                                or flat.node_cores[node_of[g]] + ni.cores < nj.cores):
                            continue
                        left[i].append(on[g][i].pop())
                        flat.give(g, ni)
                        flat.take(g, nj)
                        on[g].setdefault(j, []).append(left[j].pop())
                        swapped = improved = True
                        break
                    if swapped:
                        break
