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
    improve  after the greedy pass (which always completes), until `budget_ms` caps
             the decision
             none      nothing
             swap      local search: place what now fits, and swap a placed item for a
                       pending one of more value where that fits
             repack    swap, then re-solve each GPU that took items (as Martello and
                       Toth's MTHM improves a multiple-knapsack plan): its own items
                       and the pending ones are a small knapsack (compute, memory, the
                       node's free cores, slots) solved by branch and bound over item
                       classes with a node limit; the GPU keeps the better filling.
                       `effort` bounds a decision's work (each greedy pass and swap
                       search counts classes x GPUs, each knapsack its candidate classes
                       and nodes), so the plan does not depend on the machine's speed
                       (unless the time cap cuts it), and at scale, where one greedy pass
                       costs the whole effort, it is all that runs
             pairs     (`pack`'s) repack, then on the best plan re-solve GPUs two at a
                       time: both emptied, each filled in turn from the pending items by
                       the same knapsack, kept unless the two hold less value than
                       before (equal value is kept: a different filling opens other
                       pairs), both orders of every pair, up to three rounds, with an
                       allowance of its own (`pairs_effort`; improve.pairs). It places
                       more where per-GPU moves are stuck (docs/policies.md). Then the
                       kicks, within `kick_effort`: three GPUs drawn at random (the draws
                       fixed, so the plan is too) emptied and refilled with each class's
                       value perturbed, their pairs re-solved, the result kept unless it
                       holds less, twice from the pairs' plan (a node's freed cores
                       shared among its refilled GPUs, or taken in turn), the better
                       kept; each stops after 100 kicks in a row without a gain
             The knapsacks run compiled where numba is installed and compiled
             (`kernels`), as plain Python otherwise: the same plan, 4-30x slower,
             unless `budget_ms` stops the plain kicks first
    portfolio  the same for two more (order, score) pairs, each started only if it
             would end within the cap at the pace so far; the plan placing most wins
             (ties: the first, this policy's own order and score)
    lp       with the portfolio, one more start: the linear relaxation's plan rounded
             (`relax`, OR-Tools' GLOP), improved the same way; skipped without the
             solver or past relax.MAX_VARS variables
    hetero   each item first where its comparative advantage is largest (base.arch_aware)

Items with identical needs, value and speeds form a class; a class's GPUs are kept in a heap by
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

from hypersack.policies import kernels, relax
from hypersack.policies.base import (
    ClusterView,
    Flat,
    Item,
    Need,
    Placement,
    Plan,
    arch_aware,
    classes,
)
from hypersack.policies.improve import held, pairs, repack, swap

Order = Literal["given", "longest", "value", "density"]
Score = Literal["first", "worst", "best", "dot", "norm"]
Improve = Literal["none", "swap", "repack", "pairs"]


class ComposedOptions(BaseModel):
    """A composed policy's options (`policy_options` in the server's settings, or
    `--policy-option key=value`)."""

    model_config = ConfigDict(extra="forbid")
    order: Order = "value"
    score: Score = "worst"
    improve: Improve = "pairs"
    budget_ms: float = Field(default=500.0, ge=0.0, le=60_000.0)
    effort: int = Field(default=80_000, ge=0, le=100_000_000)
    # The pairs stage's allowance, of its own (improve: pairs): on bench_policies'
    # instances 80,000 left memory s0 at 98.9 % of the optimum, 240,000 reached 99.9 %
    # (where every instance's pairs had converged).
    pairs_effort: int = Field(default=240_000, ge=0, le=100_000_000)
    # The kicks' allowance after the pairs (improve: pairs; improve.kicks), in the same
    # units, shared by their two searches; 0 turns them off.
    kick_effort: int = Field(default=1_600_000, ge=0, le=1_000_000_000)
    portfolio: bool = True
    lp: bool = True
    # Place each item first where it has the most comparative advantage (base.arch_aware;
    # each of the two passes may use half the budget). Off by default: in the simulator
    # the restricted first pass made studies up to 16 % longer on some clusters.
    hetero: bool = False


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


# Further (order, score) pairs tried while the budget lasts, when `portfolio` is on: on
# the benches' instances each is the only best on some. (`density`/`best` was one too
# until the LP start came: it then never placed more than all the others, and leaving
# it out paid for the LP start's time.)
_PORTFOLIO: tuple[tuple[Order, Score], ...] = (("density", "worst"), ("longest", "worst"))


class ComposedPolicy:
    def __init__(self, name: str = "pack", *, order: Order = "value", score: Score = "worst",
                 improve: Improve = "pairs", budget_ms: float = 500.0,
                 effort: int = 80_000, pairs_effort: int = 240_000, kick_effort: int = 1_600_000,
                 portfolio: bool = True, hetero: bool = False, lp: bool = True) -> None:
        opts = ComposedOptions(order=order, score=score, improve=improve, budget_ms=budget_ms,
                               effort=effort, pairs_effort=pairs_effort,
                               kick_effort=kick_effort, portfolio=portfolio, hetero=hetero,
                               lp=lp)
        self.pairs_effort = opts.pairs_effort
        self.kick_effort = opts.kick_effort
        self.lp = opts.lp
        self.effort = opts.effort
        self.portfolio = opts.portfolio
        self.hetero = opts.hetero
        self.name = name
        self.order = opts.order
        self.score = opts.score
        self.improve = opts.improve
        self.budget_s = opts.budget_ms / 1000.0

    def place(self, items: Sequence[Item], cluster: ClusterView) -> Plan:
        if self.improve in ("repack", "pairs"):
            # The kernels compile on a process's first ask (unless the server is at it in
            # the background): before the decision's clock starts, so that neither its
            # budget nor its solve time holds the compiler's seconds.
            kernels.compiled("pairs_row")
        if self.hetero:
            return arch_aware(lambda i, c: self._place(i, c, self.budget_s / 2), items, cluster,
                              alone=lambda i, c: self._place(i, c, self.budget_s))
        return self._place(items, cluster, self.budget_s)

    def _place(self, items: Sequence[Item], cluster: ClusterView, budget_s: float) -> Plan:
        start = time.perf_counter()
        deadline = start + budget_s
        # Within a class, the longest run first (it starts early and overlaps with the
        # short ones).
        reps, members = classes(items)
        variants: list[tuple[Order, Score] | None] = [(self.order, self.score)]
        if self.portfolio:
            variants += [v for v in _PORTFOLIO if v not in variants]
            if self.lp and relax.available():
                variants.append(None)  # the linear relaxation's start
        # The resources' weights depend on the items and the free capacity only: the
        # same for every variant.
        sc = _Scales(cluster, Flat(cluster), items)
        best: tuple[int, Flat, list[dict[int, list[int]]], list[int], list[list[int]]] | None \
            = None
        effort = self.effort  # for the whole decision, in the units described above
        for k, variant in enumerate(variants):
            # Another variant only while effort is left and, at the pace so far, it would
            # end within the time cap.
            if k and (effort <= 0
                      or start + (time.perf_counter() - start) * (k + 1) / k > deadline):
                break
            flat = Flat(cluster)
            on: list[dict[int, list[int]]] = [{} for _ in range(len(flat))]
            if variant is None:
                order = list(range(len(reps)))
                left = [its[::-1] for its in members]  # pop() gives the longest first
                solved = relax.lp_start(reps, flat, left, on)
                if solved is None:
                    continue
                effort -= solved
            else:
                order_by, score = variant
                order = self._class_order(order_by, reps, members, items, flat, sc)
                left = [[] for _ in reps]
                scorer = _scorer(score, flat, sc)
                for c in order:
                    self._greedy(c, reps[c], members[c], flat, scorer, on, left)
                effort -= len(reps) * len(flat)
            if self.improve != "none" and effort > 0:
                swap(reps, flat, on, left, deadline)
                effort -= len(reps) * len(flat)
            if self.improve in ("repack", "pairs") and effort > 0:
                effort -= repack(reps, flat, on, left, deadline, effort)
            value = sum(held(reps, by_class) for by_class in on)
            if best is None or value > best[0]:
                best = (value, flat, on, order, left)
        assert best is not None
        objective, flat, on, order, left = best
        if self.improve == "pairs" and any(left):
            pairs(reps, flat, on, left, deadline, self.pairs_effort, self.kick_effort)
            objective = sum(held(reps, by_class) for by_class in on)
        placements: list[Placement] = []
        placed: set[int] = set()
        for g, by_class in enumerate(on):
            for its in by_class.values():
                for i in its:
                    placements.append(flat.placement(items[i].id, g))
                    placed.add(i)
        unplaced = tuple(items[i].id for c in order for i in members[c] if i not in placed)
        return Plan(placements=tuple(placements), unplaced=unplaced,
                    solve_time_s=time.perf_counter() - start, objective=objective)

    @staticmethod
    def _class_order(order: Order, classes: list[Item], members: list[list[int]],
                     items: Sequence[Item], flat: Flat, sc: _Scales) -> list[int]:
        """Classes in the policy's order, ties in first-seen order."""
        first_gpu: dict[str, int] = {}
        for g, a in enumerate(flat.arch):
            first_gpu.setdefault(a, g)
        if order == "given":
            return list(range(len(classes)))
        if order == "longest":
            return sorted(range(len(classes)), key=lambda c: -items[members[c][0]].run_time_s)
        if order == "value":
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
