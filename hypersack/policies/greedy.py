"""The paper's greedy rules: first fit and worst fit, each plain or 'decreasing'.

"Decreasing" sorts items by expected run time, longest first (so long trials start
early and overlap with short ones). First fit walks nodes, then GPUs, in order and
takes the first GPU whose scaled compute, memory and node cores all fit. Worst fit
takes, among the GPUs that fit, the one with the most free scaled compute (ties: the
first in order). Both are exact implementations of those rules; two observations make
them fast without changing any decision:
- capacity only shrinks during one decision, so a need that fitted nowhere fits nowhere
  later: identical needs are rejected from a cache;
- worst fit keeps the GPUs in a heap by free compute; first fit skips the prefix of GPUs
  too full for the smallest need in the batch, and resumes an identical need's scan at
  the GPU that took the previous one.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from hypersack.policies.base import (
    ClusterView,
    Flat,
    Item,
    Need,
    Placement,
    Plan,
    arch_aware,
    arch_weights,
)

# `eft`: GPUs where an item would end within this share of its soonest end count as
# soon as that one, and the most free of them takes it (spreading the work, where a
# strict soonest end piled items of one length on the GPU whose longest ends first).
# scripts/sim_makespan.py, 72 scenarios on seeds 0-5 and 72 on seeds 6-11: `eft`'s own
# makespans 1.95 % and 2.7 % shorter than strict (geometric mean; up to 13 % longer in a
# few fused memory-bound studies of one wave), within 2 % of the best policy in 53 and
# 59 (strict: 55 and 60), the worst case 1.11 and 1.08 (strict: 1.11 and 1.27). 0.3
# made two of scripts/sim_hetero.py's six clusters end 8 % later (faster H100s weighed
# as about as soon); up to 0.2 none moved. docs/policies.md has the rest.
EFT_TOLERANCE = 0.2
# How many GPUs that already took an item in the decision are weighed per architecture
# (by their longest item, then the most free): a bound on each item's cost whatever the
# cluster's size.
EFT_SCAN = 8


def _order(items: Sequence[Item], decreasing: bool) -> list[int]:
    if not decreasing:
        return list(range(len(items)))
    # Stable sort: equal run times keep their submission order.
    return sorted(range(len(items)), key=lambda i: -items[i].run_time_s)


class GreedyOptions(BaseModel):
    """The greedy rules' option (`policy_options` in the server's settings, or
    `--policy-option key=value`)."""

    model_config = ConfigDict(extra="forbid")
    # Heterogeneity-aware: worst fit weighs GPUs by each trial's comparative advantage
    # and speed (base.arch_weights); first fit places each trial first where its
    # advantage is largest (base.arch_aware). False: the paper's architecture-blind rule.
    hetero: bool = True


class GreedyPolicy:
    def __init__(self, name: str, *, decreasing: bool, worst: bool, hetero: bool = True) -> None:
        self.name = name
        self.decreasing = decreasing
        self.worst = worst
        self.hetero = GreedyOptions(hetero=hetero).hetero

    def place(self, items: Sequence[Item], cluster: ClusterView) -> Plan:
        if not self.hetero:
            return self._place(items, cluster)
        if not self.worst:
            return arch_aware(self._place, items, cluster)
        return self._place(items, cluster, arch_weights(items))

    def _place(self, items: Sequence[Item], cluster: ClusterView,
               weights: list[Mapping[str, float]] | None = None) -> Plan:
        start = time.perf_counter()
        flat = Flat(cluster)
        order = _order(items, self.decreasing)
        if self.worst and weights is not None:
            chosen = _worst_fit_aware(items, order, flat, weights)
        elif self.worst:
            chosen = _worst_fit(items, order, flat)
        else:
            chosen = _first_fit(items, order, flat)
        return _plan(items, order, flat, chosen, start)


def _plan(items: Sequence[Item], order: list[int], flat: Flat, chosen: list[tuple[int, int]],
          start: float) -> Plan:
    """The plan of (item, GPU) choices; what was not chosen is unplaced, in `order`."""
    placements: list[Placement] = []
    placed: set[int] = set()
    objective = 0
    for i, g in chosen:
        placements.append(flat.placement(items[i].id, g))
        objective += items[i].value
        placed.add(i)
    unplaced = tuple(items[i].id for i in order if i not in placed)
    return Plan(placements=tuple(placements), unplaced=unplaced,
                solve_time_s=time.perf_counter() - start, objective=objective)


def _signature(needs: Mapping[str, Need], cache: dict[int, tuple[tuple[str, Need], ...]]
               ) -> tuple[tuple[str, Need], ...]:
    # Items of one workload share one needs mapping, so this sorts once per workload.
    sig = cache.get(id(needs))
    if sig is None:
        sig = tuple(sorted(needs.items()))
        cache[id(needs)] = sig
    return sig


def _minimum(items: Sequence[Item]) -> Need:
    needs = [n for it in items for n in it.needs.values()]
    if not needs:
        return Need(0, 0, 0)
    return Need(min(n.compute for n in needs), min(n.memory for n in needs),
                min(n.cores for n in needs))


def _first_fit(items: Sequence[Item], order: list[int], flat: Flat) -> list[tuple[int, int]]:
    low = _minimum(items)

    # Only the GPUs open at the start can take anything in this decision (capacity only
    # shrinks), so they are the scan, in position order: at 8,000 GPUs, most of them
    # full, each need that fitted nowhere walked all of them.
    scan = sorted(g for g in flat.roomy(low.compute) if flat.fits(g, low))
    n_open = len(scan)
    first_open = 0  # positions in `scan`
    failed: set[tuple[tuple[str, Need], ...]] = set()
    # GPUs before the one that took the last identical need did not fit it then, and
    # cannot now: an identical need resumes its scan there.
    resume: dict[tuple[tuple[str, Need], ...], int] = {}
    sigs: dict[int, tuple[tuple[str, Need], ...]] = {}
    chosen: list[tuple[int, int]] = []
    arch = flat.arch
    for i in order:
        needs = items[i].needs
        sig = _signature(needs, sigs)
        if sig in failed:
            continue
        for k in range(max(first_open, resume.get(sig, 0)), n_open):
            g = scan[k]
            need = needs.get(arch[g])
            if need is not None and flat.fits(g, need):
                flat.take(g, need)
                chosen.append((i, g))
                resume[sig] = k
                while first_open < n_open and not flat.fits(scan[first_open], low):
                    first_open += 1
                break
        else:
            failed.add(sig)
    return chosen


def _worst_fit(items: Sequence[Item], order: list[int], flat: Flat) -> list[tuple[int, int]]:
    low = _minimum(items)
    # A GPU with less free compute than the smallest need never comes off the heap
    # (the scan below stops there): left out, a full cluster of 8,000 GPUs costs a heap
    # of its few free ones, not of all.
    heap = [(-flat.compute[g], g) for g in flat.roomy(low.compute) if flat.fits(g, low)]
    heapq.heapify(heap)
    failed: set[tuple[tuple[str, Need], ...]] = set()
    sigs: dict[int, tuple[tuple[str, Need], ...]] = {}
    chosen: list[tuple[int, int]] = []
    arch = flat.arch
    for i in order:
        needs = items[i].needs
        sig = _signature(needs, sigs)
        if sig in failed:
            continue
        least = min(n.compute for n in needs.values()) if needs else 0
        aside: list[tuple[int, int]] = []
        pick = -1
        while heap and -heap[0][0] >= least:
            entry = heapq.heappop(heap)
            g = entry[1]
            need = needs.get(arch[g])
            if need is not None and flat.fits(g, need):
                flat.take(g, need)
                pick = g
                break
            # Keep a GPU for later items only while it can still take the smallest need.
            if flat.fits(g, low):
                aside.append(entry)
        for entry in aside:
            heapq.heappush(heap, entry)
        if pick < 0:
            failed.add(sig)
            continue
        chosen.append((i, pick))
        if flat.fits(pick, low):
            heapq.heappush(heap, (-flat.compute[pick], pick))
    return chosen


def _worst_fit_aware(items: Sequence[Item], order: list[int], flat: Flat,
                     weights: list[Mapping[str, float]]) -> list[tuple[int, int]]:
    """Worst fit that weighs each GPU's free share of its scaled compute by the item's
    weight on its architecture (base.arch_weights): a trial that gains most from an
    H100 takes an H100 while H100s are about as free as the A100s, and an A100 once the
    H100s are fuller by more than its weight says. One heap per architecture (free
    share, then position), so the choice costs a pop per architecture."""
    full = flat.full_compute
    # A GPU that cannot take the decision's smallest need (`low`) never takes anything
    # in it (capacity only shrinks), so it leaves the heaps: at 8,000 GPUs, most of them
    # full, a need that fitted nowhere popped them all.
    low = _minimum(items)
    heaps: dict[str, list[tuple[float, int]]] = {}
    for g in flat.roomy(low.compute):
        if flat.fits(g, low):
            heaps.setdefault(flat.arch[g], []).append((-flat.compute[g] / max(1, full[g]), g))
    for h in heaps.values():
        heapq.heapify(h)
    chosen: list[tuple[int, int]] = []
    failed: set[int] = set()  # needs that fitted nowhere (capacity only shrinks)
    for i in order:
        needs = items[i].needs
        if id(needs) in failed:
            continue
        best = (0.0, -1)
        tops: list[tuple[str, tuple[float, int]]] = []
        for a, need in needs.items():
            heap = heaps.get(a)
            if heap is None:
                continue
            aside: list[tuple[float, int]] = []
            while heap:
                entry = heapq.heappop(heap)
                g = entry[1]
                if flat.fits(g, need):
                    tops.append((a, entry))
                    key = entry[0] * weights[i].get(a, 1.0)
                    if best[1] < 0 or (key, g) < best:
                        best = (key, g)
                    break
                if flat.fits(g, low):
                    aside.append(entry)
            for entry in aside:
                heapq.heappush(heap, entry)
        g = best[1]
        for a, entry in tops:
            if entry[1] != g:
                heapq.heappush(heaps[a], entry)
        if g < 0:
            failed.add(id(needs))
            continue
        flat.take(g, needs[flat.arch[g]])
        chosen.append((i, g))
        if flat.fits(g, low):
            heapq.heappush(heaps[flat.arch[g]], (-flat.compute[g] / max(1, full[g]), g))
    return chosen


class EarliestFinishPolicy:
    """`eft`: longest first, each to the GPU where it would end soonest (list scheduling
    by earliest finish time, as HEFT and LPT on machines of different speeds).

    Its end on a GPU is its expected run time on that GPU's architecture (the run time
    over its speed there), or, where a longer item was placed on that GPU in this
    decision, that item's: trials sharing a GPU run at once, so a GPU ends with the
    longest of its items. Among the GPUs where it would end within EFT_TOLERANCE (20 %)
    of its soonest end, the one with the most free share of its scaled compute (worst
    fit), then the sooner end, then the first; of the GPUs of an architecture that took
    an item in this decision, the EFT_SCAN (8) whose longest items end first are weighed.
    So the longest work goes to the fastest architecture, spread over the GPUs that end
    it about as soon, and a slower GPU takes an item only where that ends it about as
    soon as waiting behind a longer one would. Scaled compute, memory, slots and the
    node's cores must fit, as for every rule; trials already running are not counted
    (their remaining time is not known to the decision).

    Where models gain differently from an architecture (`hetero`, the default), each item
    is first placed only where its comparative advantage is largest, then what is left
    anywhere (base.arch_aware, as first fit does): the soonest end alone sends whatever
    is longest to the fastest GPUs, and a model that gains 3x from an H100 waited behind
    one that gains 1.2x (in scripts/sim_hetero.py's six scenarios studies ended 1-11 %
    later than with wfd's weighting in five and 8 % sooner in one; with the preference
    first, 2.5-8 % sooner in five and 4.9 % later in one). Where every model gains
    alike, nothing changes. `hetero` false: every item's run time is its longest,
    everywhere (blind)."""

    name = "eft"

    def __init__(self, *, hetero: bool = True, tolerance: float = EFT_TOLERANCE) -> None:
        self.hetero = GreedyOptions(hetero=hetero).hetero
        if not 0.0 <= tolerance <= 10.0:
            raise ValueError(f"eft's tolerance must lie in [0, 10], got {tolerance!r}")
        self.tolerance = tolerance  # 0: the strict soonest end (auto's)

    def place(self, items: Sequence[Item], cluster: ClusterView) -> Plan:
        if self.hetero:
            return arch_aware(self.rule, items, cluster)
        return self.rule(items, cluster)

    def rule(self, items: Sequence[Item], cluster: ClusterView) -> Plan:
        """The earliest-finish rule itself, over the architectures each item names."""
        start = time.perf_counter()
        flat = Flat(cluster)
        order = _order(items, decreasing=True)
        chosen = _earliest_finish(items, order, flat, self.hetero, self.tolerance)
        return _plan(items, order, flat, chosen, start)


def _earliest_finish(items: Sequence[Item], order: list[int], flat: Flat, hetero: bool = True,
                     tolerance: float = EFT_TOLERANCE) -> list[tuple[int, int]]:
    """Per architecture two heaps: GPUs that took nothing yet in this decision, by free
    share (most first), and GPUs that did, by (the longest item placed there, free share).
    An item's end on an untouched GPU is its own run time there, so that heap's first GPU
    that fits is its best there; on a touched one, the longer of that and the GPU's
    longest, so that heap's first EFT_SCAN that fit are those that end it soonest (the
    order of its keys is the order of the ends). A GPU that does not fit is set
    aside until an item with other needs comes (capacity only shrinks: it cannot fit
    the next item of the same needs either, and items of one class come together in the
    longest-first order); one that cannot take the decision's smallest need leaves for
    good, and an architecture none of whose GPUs has
    the compute or the memory an item needs is not searched for it (the most free of
    each is kept in a lazy heap), so a decision that fills the cluster does not scan
    every full GPU for each item left over."""
    full = flat.full_compute
    low = _minimum(items)
    # (the longest item placed there in this decision, free share negated, GPU)
    fresh: dict[str, list[tuple[float, float, int]]] = {}
    used: dict[str, list[tuple[float, float, int]]] = {}
    most_c: dict[str, list[tuple[int, int]]] = {}  # lazy: (-free compute, GPU)
    most_m: dict[str, list[tuple[int, int]]] = {}  # lazy: (-free memory, GPU)
    longest = [0.0] * len(flat)

    def share(g: int) -> float:
        return -flat.compute[g] / max(1, full[g])

    def run_on(it: Item, a: str) -> float:
        """The item's expected run time on architecture `a` (blind: its longest)."""
        return it.run_time_s / it.speed.get(a, 1.0) if it.speed and hetero else it.run_time_s

    def most(heaps: dict[str, list[tuple[int, int]]], a: str, free: list[int]) -> int:
        heap = heaps.get(a)
        while heap and (-heap[0][0] != free[heap[0][1]] or not flat.fits(heap[0][1], low)):
            heapq.heappop(heap)  # stale: that GPU took an item (a fresher entry follows)
        return -heap[0][0] if heap else -1

    for g in flat.roomy(low.compute):
        if flat.fits(g, low):
            a = flat.arch[g]
            fresh.setdefault(a, []).append((0.0, share(g), g))
            most_c.setdefault(a, []).append((-flat.compute[g], g))
            most_m.setdefault(a, []).append((-flat.memory[g], g))
    for h in fresh.values():
        heapq.heapify(h)
    for by_arch in (most_c, most_m):
        for h2 in by_arch.values():
            heapq.heapify(h2)
    chosen: list[tuple[int, int]] = []
    failed: set[int] = set()  # needs that fitted nowhere (capacity only shrinks)
    # GPUs that did not fit the current needs, by (architecture, touched), kept out of
    # the heaps while items of those needs come.
    parked: dict[tuple[str, bool], list[tuple[float, float, int]]] = {}
    parked_for = -1
    for i in order:
        it = items[i]
        needs = it.needs
        if id(needs) in failed:
            continue
        if id(needs) != parked_for:
            for (a, touched), entries in parked.items():
                heap = (used if touched else fresh)[a]
                for entry in entries:
                    if flat.fits(entry[-1], low):
                        heapq.heappush(heap, entry)
            parked = {}
            parked_for = id(needs)
        # (its end there, free share negated, GPU): the most free GPU of each
        # architecture that took nothing yet, and the first EFT_SCAN that took something,
        # by their longest item (the order of their ends).
        found: list[tuple[float, float, int]] = []
        tops: list[tuple[str, bool, tuple[float, float, int]]] = []  # (arch, touched, entry)
        for a, need in needs.items():
            if most(most_c, a, flat.compute) < need.compute or \
                    most(most_m, a, flat.memory) < need.memory:
                continue  # no GPU of this architecture has room enough
            run = run_on(it, a)
            for touched in (False, True):
                heap = (used if touched else fresh).get(a, [])
                taken = 0
                while heap and taken < (EFT_SCAN if touched else 1):
                    entry = heapq.heappop(heap)
                    g = entry[-1]
                    if flat.fits(g, need):
                        tops.append((a, touched, entry))
                        found.append((max(longest[g], run), share(g), g))
                        taken += 1
                    elif flat.fits(g, low):
                        parked.setdefault((a, touched), []).append(entry)
        if not found:
            failed.add(id(needs))
            continue
        soonest = min(end for end, _, _ in found) * (1 + tolerance)
        g = min((f for f in found if f[0] <= soonest), key=lambda f: (f[1], f[0], f[2]))[2]
        for a, touched, entry in tops:
            if entry[-1] != g:
                heapq.heappush((used if touched else fresh)[a], entry)
        a = flat.arch[g]
        flat.take(g, needs[a])
        longest[g] = max(longest[g], run_on(it, a))
        chosen.append((i, g))
        if flat.fits(g, low):
            heapq.heappush(used.setdefault(a, []), (longest[g], share(g), g))
            heapq.heappush(most_c[a], (-flat.compute[g], g))
            heapq.heappush(most_m[a], (-flat.memory[g], g))
    return chosen
