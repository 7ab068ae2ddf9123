"""`auto`: the spreading rule `eft`, unless `pack` places clearly more work.

The two rules are good at different things. `eft` (earliest finish: the longest trials
first, each to the GPU where it would end soonest; `greedy.EarliestFinishPolicy`)
spreads trials over the GPUs, and in the simulator studies end soonest with it. But it
weighs neither memory nor the nodes' cores, so where those bind it places a fraction of
what fits (15-80 % of the CP-SAT optimum on the heterogeneous benches) and can leave
large-memory trials pending while memory sits free. `pack` places within a few percent
of the optimum there. `auto` runs `eft`; when trials are left over, it also runs `pack`
and takes its plan if it places more work than `eft` by more than `margin` (5 %) of the
cluster's scaled compute. Relative to the cluster, not to `eft`'s plan: a decision that
fills one freed slot may differ by a trial, which is much of that decision but little
of the cluster, and there the spreading rule finished the simulator's studies sooner.
`hetero` lets `eft` place each trial first where it gains most (`pack` runs blind
here; see docs/policies.md). Where `pack` would win, the blind `eft` is tried too: the
preference can leave work pending that the blind rule places, and then the blind spread
is taken if it comes within the margin of `pack`'s plan. Before `eft` the spreading rule
was `wfd`: over scripts/sim_makespan.py's 72 scenarios the studies under `auto` ended
1.060x the best policy's on average, against 1.266x with `wfd`. `auto` keeps `eft`'s
strict soonest end (the default `eft` counts ends within 20 % as soon).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace

from pydantic import BaseModel, ConfigDict, Field

from hypersack.policies.base import ClusterView, Item, Plan
from hypersack.policies.compose import ComposedPolicy
from hypersack.policies.greedy import EarliestFinishPolicy


class AutoOptions(BaseModel):
    """`auto`'s options (`policy_options: {auto: {...}}` in the server's settings, or
    `--policy-option key=value`)."""

    model_config = ConfigDict(extra="forbid")
    margin: float = Field(default=0.05, ge=0.0, le=10.0, allow_inf_nan=False)
    hetero: bool = True
    budget_ms: float = Field(default=500.0, ge=0.0, le=60_000.0, allow_inf_nan=False)
    effort: int = Field(default=80_000, ge=0, le=100_000_000)


class AutoPolicy:
    name = "auto"

    def __init__(self, *, margin: float = 0.05, hetero: bool = True, budget_ms: float = 500.0,
                 effort: int = 80_000) -> None:
        opts = AutoOptions(margin=margin, hetero=hetero, budget_ms=budget_ms, effort=effort)
        self.margin = opts.margin
        # The strict soonest end: the tolerant one places a little less work in memory-
        # bound fused decisions, and auto then took pack's plan, which made three of
        # scripts/sim_makespan.py's scenarios end 31-59 % later.
        self.spread = EarliestFinishPolicy(hetero=opts.hetero, tolerance=0.0)
        self.blind = EarliestFinishPolicy(hetero=False, tolerance=0.0) if opts.hetero else None
        # pack's own preference (a first pass restricted to preferred architectures)
        # made simulated studies up to 28 % longer; the heterogeneity-aware part of auto
        # is the spreading rule's. One GPU's knapsack as the improvement, not pack's
        # pairs: pairs place more work per decision, but in scripts/sim_makespan.py
        # auto's studies then ended 1.116x the best policy's on average over the 72
        # scenarios, against 1.060x (1.36x against 1.10x on core-bound fused studies).
        self.packed = ComposedPolicy("pack", hetero=False, budget_ms=opts.budget_ms,
                                     effort=opts.effort, improve="repack")

    def place(self, items: Sequence[Item], cluster: ClusterView) -> Plan:
        start = time.perf_counter()
        spread = self.spread.place(items, cluster)
        chosen = spread
        packed: Plan | None = None
        capacity = sum(g.full_compute for n in cluster.nodes for g in n.gpus)
        # When everything fits, or even all the free compute could not hold the margin
        # (a decision that refills a GPU or two), packing cannot win: `pack` is not run.
        if spread.unplaced and _most(items, cluster) - spread.objective > self.margin * capacity:
            packed = self.packed.place(items, cluster)
            if packed.objective - spread.objective > self.margin * capacity:
                chosen = packed
                # The preference pass can leave work pending that the blind rule places
                # (a trial kept for the GPUs where it gains most while those are full):
                # then the blind spread, if it comes within the margin of `pack`'s.
                if self.blind is not None:
                    blind = self.blind.place(items, cluster)
                    if packed.objective - blind.objective <= self.margin * capacity:
                        chosen = blind
        return replace(chosen, solve_time_s=time.perf_counter() - start,
                       info={**chosen.info, "packed": float(chosen is packed)})


def _most(items: Sequence[Item], cluster: ClusterView) -> float:
    """An upper bound on the work any plan places: all of it, or the free compute of
    each architecture times the most value per unit of it an item there has."""
    total = sum(it.value for it in items)
    rate: dict[str, float] = {}
    for it in items:
        for arch, need in it.needs.items():
            r = it.value / need.compute if need.compute > 0 else float("inf")
            if r > rate.get(arch, 0.0):
                rate[arch] = r
    gpus = [g for n in cluster.nodes for g in n.gpus if g.arch in rate]
    if any(math.isinf(rate[g.arch]) for g in gpus):  # trials that need no compute
        return float(total)
    return min(float(total), sum(g.compute * rate[g.arch] for g in gpus))
