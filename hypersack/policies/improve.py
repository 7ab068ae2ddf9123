"""Improvement stages of the composed policies (`compose`), after a greedy pass or the
LP start has placed what it could: each moves items between the GPUs and the pending
pool (`left`, per class, a stack whose pop() gives the longest run first) and never ends
with less value placed than it began with.

    swap     place what now fits, and swap a placed item for a pending one of more value
    repack   re-solve one GPU at a time: its own items and the pending ones as a small
             knapsack (branch and bound over classes, a node limit per GPU)
    pairs    re-solve two GPUs at a time: both emptied, each filled in turn by the same
             knapsack; what one GPU gives up the other may take, which one GPU's knapsack
             alone can never reach
    kicks    after the pairs, iterated local search: empty three GPUs drawn at random,
             refill them with perturbed values, re-solve their pairs, keep the result
             unless it holds less

repack and pairs run on counts per GPU and class (`Counts`), by `kernels`: compiled where
numba is, plain Python otherwise, with the same plans. Effort is counted in the
knapsacks' nodes, candidate classes and walks over the classes, and the counts' size, so
a plan does not depend on the machine's speed unless the deadline cuts the search.
"""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

from hypersack.policies import kernels
from hypersack.policies.base import Flat, Item, Need


def swap(classes: list[Item], flat: Flat, on: list[dict[int, list[int]]],
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


_REPACK_ROUNDS = 3


# The columns of Counts.cols the kernels change: free compute, memory, slots and cores,
# the counts, the pool, the items per GPU.
_CHANGED = (0, 1, 2, 3, 12, 13, 14)


class Counts:
    """The plan as counts per GPU and class, in the flat int64 sequences `kernels`
    works on (NumPy arrays for the compiled rounds, lists for the plain ones), and back."""

    def __init__(self, classes: list[Item], flat: Flat, on: list[dict[int, list[int]]],
                 left: list[list[int]], fast: bool) -> None:
        G, C = len(flat), len(classes)
        archs = sorted(set(flat.arch))
        arch_index = {a: i for i, a in enumerate(archs)}
        A = len(archs)
        need_c = [0] * (A * C)
        need_m = [0] * (A * C)
        need_k = [0] * (A * C)
        rows = [0] * (A * C)
        nrows = [0] * A
        for a, ordered in _densest(classes, flat).items():
            x = arch_index[a]
            nrows[x] = len(ordered)
            for r, (c, n, _) in enumerate(ordered):
                rows[x * C + r] = c
                need_c[x * C + c], need_m[x * C + c], need_k[x * C + c] = n
        counts = [0] * (G * C)
        tot = [0] * G
        for g, own in enumerate(on):
            for c, its in own.items():
                counts[g * C + c] = len(its)
                tot[g] += len(its)
        self.G, self.C = G, C
        compute, memory, cores = list(flat.compute), list(flat.memory), list(flat.node_cores)
        value = [rep.value for rep in classes]
        # In the order of the kernels' arguments (knapsack's module doc).
        cols: list[list[int]] = [
            compute, memory, list(flat.slots), cores, list(flat.node_of),
            [arch_index[a] for a in flat.arch], need_c, need_m, need_k, value, rows, nrows,
            counts, [len(x) for x in left], tot]
        size = kernels.scratch_size(C, sum(tot) + sum(len(x) for x in left))
        # The compiled kernels' int64 products stay exact below 2^31 (knapsack._bound);
        # larger numbers (no real GPU's) go to the plain kernels' Python integers.
        self.fast = fast and max(max(col, default=0) for col in (
            compute, memory, cores, need_c, need_m, need_k, value)) < 1 << 31
        if self.fast:
            import numpy as np

            self.cols: list[Any] = [np.array(col, dtype=np.int64) for col in cols]
            self.work: Any = np.zeros(size, dtype=np.int64)
            self.new: Callable[[int, int], Any] = \
                lambda n, fill: np.full(n, fill, dtype=np.int64)
        else:
            self.cols = cols
            self.work = [0] * size
            self.new = lambda n, fill: [fill] * n

    @property
    def on(self) -> Any:
        """Items of each class per GPU (`on[g * C + c]`), as the kernels left them."""
        return self.cols[12]

    @property
    def left(self) -> Any:
        """Pending items of each class."""
        return self.cols[13]

    def value(self) -> int:
        """The value the plan holds."""
        value, on, C = self.cols[9], self.cols[12], self.C
        if self.fast:  # int64: under 2^31 a class's value, and far fewer than 2^23 items
            return int((on.reshape(self.G, C) * value).sum())
        return sum(int(on[g * C + c]) * int(value[c]) for g in range(self.G)
                   for c in range(C) if on[g * C + c])

    def cores_bind(self) -> bool:
        """Whether some node's free cores are fewer than one item of some class needs."""
        most = max((int(k) for k in self.cols[8]), default=0)
        return any(int(free) < most for free in self.cols[3])

    def saved(self) -> list[Any]:
        """A copy of what the kernels change (the free capacity, the counts, the pool),
        for `restore`."""
        return [copy.copy(self.cols[i]) for i in _CHANGED]

    def restore(self, saved: list[Any]) -> None:
        """Put back the plan `saved` copied."""
        for i, col in zip(_CHANGED, saved, strict=True):
            self.cols[i] = col

    def apply(self, classes: list[Item], flat: Flat, on: list[dict[int, list[int]]],
              left: list[list[int]]) -> None:
        """Move items so that each GPU holds the counts: first what each GPU gives up
        goes back to the pending pool, then each takes what it gained from it (the pool
        is a stack: the last given back goes out first)."""
        C = self.C
        new = self.on
        gained: list[tuple[int, int, int]] = []
        for g, own in enumerate(on):
            a = flat.arch[g]
            for c, its in own.items():
                k = len(its) - int(new[g * C + c])
                for _ in range(k):
                    left[c].append(its.pop())
                    flat.give(g, classes[c].needs[a])
        for g in range(self.G):
            row = g * C
            own = on[g]
            for c in range(C):
                k = int(new[row + c]) - len(own.get(c, ()))
                if k > 0:
                    gained.append((g, c, k))
        for g, c, k in gained:
            need = classes[c].needs[flat.arch[g]]
            its = on[g].setdefault(c, [])
            for _ in range(k):
                flat.take(g, need)
                its.append(left[c].pop())


# What yields one round's calls of a kernel, each given the effort left.
RoundCalls = Callable[[], Iterator[Callable[[int], int]]]


def _kernel(name: str, st: Counts) -> Callable[..., int]:
    """The kernel `name` compiled where the counts allow it (`Counts.fast`) and it is
    compiled, else its plain form."""
    fn = kernels.compiled(name) if st.fast else None
    return fn if fn is not None else cast(Callable[..., int], getattr(kernels, name))


def _rounds(name: str, classes: list[Item], flat: Flat, on: list[dict[int, list[int]]],
            left: list[list[int]], deadline: float, effort: int,
            calls: Callable[[Callable[..., int], Counts], RoundCalls],
            after: Callable[[Counts], int] | None = None) -> int:
    """Run a kernel's rounds (compiled where it is, plain otherwise) until a round gains
    nothing (at most three), `effort` is spent or the deadline; then move the items as
    the counts say. `calls` gives, once, what yields a round's calls (each given the
    effort left). Returns the effort spent, the counts' size (GPUs x classes) included:
    where that alone is past `effort`, nothing runs."""
    size = len(flat) * len(classes)
    if size > effort:
        return 0  # the counts alone would cost more than the allowance
    st = Counts(classes, flat, on, left, fast=kernels.compiled(name) is not None)
    spent = size + _run(calls(_kernel(name, st), st), deadline, effort - size)
    if after is not None:
        spent += after(st)
    st.apply(classes, flat, on, left)
    return spent


def _run(one_round: RoundCalls, deadline: float, effort: int) -> int:
    spent = 0
    for _ in range(_REPACK_ROUNDS):
        gained = False
        for call in one_round():
            if spent >= effort or time.perf_counter() > deadline:
                break
            r = call(effort - spent)
            spent += r % kernels.GAINED
            gained = gained or r >= kernels.GAINED
        else:
            if gained:
                continue
        break
    return spent


def repack(classes: list[Item], flat: Flat, on: list[dict[int, list[int]]],
            left: list[list[int]], deadline: float, effort: int) -> int:
    """Re-solve, one GPU at a time, the knapsack of its own items and the pending ones
    (`kernels.repack_gpu`), and keep the filling of most value (never less than the GPU
    had). Repeats while a round improves, up to three rounds, or until the deadline.
    Only GPUs that hold items are re-solved: after the greedy pass and `swap`, no
    pending item fits anywhere as the plan stands. Returns the effort spent."""
    def calls(fn: Callable[..., int], st: Counts) -> RoundCalls:
        # Kept across rounds: a GPU solved without gain is not solved again until the
        # pending pool changes.
        solved_at = st.new(st.G, -1)
        changes = st.new(1, 0)

        def one_round() -> Iterator[Callable[[int], int]]:
            yield lambda budget: fn(st.G, st.C, *st.cols, budget, st.work, solved_at, changes)
        return one_round
    return _rounds("repack_round", classes, flat, on, left, deadline, effort, calls)


def _densest(classes: list[Item], flat: Flat) -> dict[str, list[tuple[int, Need, int]]]:
    """Per architecture, the classes densest first (value over size, each resource
    normalized by the largest need of it): one sort per decision, not per GPU."""
    by_arch: dict[str, list[tuple[int, Need, int]]] = {}
    for a in set(flat.arch):
        rows = [(c, rep.needs[a], rep.value) for c, rep in enumerate(classes) if a in rep.needs]
        top_c = max((n.compute for _, n, _ in rows), default=1) or 1
        top_m = max((n.memory for _, n, _ in rows), default=1) or 1
        top_k = max((n.cores for _, n, _ in rows), default=1) or 1
        rows.sort(key=lambda r: -r[2] / (r[1].compute / top_c + r[1].memory / top_m
                                         + r[1].cores / top_k + 1e-9))
        by_arch[a] = rows
    return by_arch


def held(classes: list[Item], own: dict[int, list[int]]) -> int:
    """The value one GPU holds: its items' by class."""
    return sum(classes[c].value * len(its) for c, its in own.items())


def _pair_call(fn: Callable[..., int], st: Counts, saved: Any, g: int, budget: int) -> int:
    return fn(g, st.G, st.C, *st.cols, budget, st.work, saved)


def pairs(classes: list[Item], flat: Flat, on: list[dict[int, list[int]]],
          left: list[list[int]], deadline: float, effort: int, kick_effort: int = 0,
          seed: int = 0) -> int:
    """Re-solve GPUs two at a time, every ordered pair (`kernels.pairs_row`), until a
    round gains nothing (at most three rounds), `effort` is spent or the deadline: both
    GPUs are emptied, then filled in turn from the pending pool by the one-GPU knapsack.
    A pair that ends with less value than it had is put back as it was; equal value is
    kept. Returns the effort spent.

    One GPU's knapsack (`repack`) cannot take an item from another GPU; here the first
    GPU of a pair may take the second's items and the second refills from what is left,
    which is how a memory-bound plan trades a compute-heavy item on one GPU for two
    lighter ones on the other. On bench_policies' memory-bound instances this placed
    98.9-99.6 % of CP-SAT's plan where `repack` alone stopped at 98.0-98.5 %.

    Then, with `kick_effort`, the kicks (`kicks`): pairs converge to a plan that no
    single pair improves, and the kicks leave it on purpose to find a better one."""
    def calls(fn: Callable[..., int], st: Counts) -> RoundCalls:
        saved = st.new(3 * st.C, 0)

        def one_round() -> Iterator[Callable[[int], int]]:
            for g in range(st.G):
                yield functools.partial(_pair_call, fn, st, saved, g)
        return one_round

    def after(st: Counts) -> int:
        return kicks(st, deadline, kick_effort, seed) if kick_effort > 0 else 0
    return _rounds("pairs_row", classes, flat, on, left, deadline, effort, calls, after)


# The kicks' allowance is spent in this many calls, the deadline checked between them.
_KICK_CHUNKS = 8
KICK_WIDTH = 3  # GPUs emptied per kick
KICK_STALL = 100  # kicks in a row without a gain after which the kicks stop
# ... on clusters of fewer than 16 GPUs, this over the GPUs instead: a kick's three are
# most of such a cluster and its draws repeat, so a gain takes more of them. On 4 GPUs
# (bench_pack_heldout.py --shapes, few-4 memory 1) 100 stopped at 98.55 % of the
# optimum, 400 reached it; SP3's first decision (4 GPUs) costs 11.5 ms instead of 8.
KICK_STALL_SMALL = 1600
KICK_NOISE = 300  # per mille: how far a kick's refill values stray from the true ones


def kicks(st: Counts, deadline: float, effort: int, seed: int) -> int:
    """Two searches by kicks from the plan the pairs left (`_kicks`), each with half of
    `effort`: one whose refills share a node's free cores, one whose refills take them
    in turn; the plan that holds more stays (the first on a tie). Returns the effort
    spent.

    Why two: where a node's cores bind (bench_policies' mixed s9), refills in turn let
    the first GPU take the cores the kick freed, and the search stopped at 97.9 % of
    CP-SAT's plan; sharing them reached 99.3 %, but moved other instances below 99 %
    (memory s22 of the held-out mixes, a mixed instance on 32 A100s). Which way finds
    more differs by instance and not by anything seen before the search, so both run,
    and the plan is never worse than either alone would give with its half. Where no
    node's cores bind (each has room for the most any class needs), sharing them only
    narrows the refills: the search in turn runs alone (SP3, SP4, the scale points)."""
    if not st.cores_bind():
        return _kicks(st, deadline, effort - effort // 2, seed, 1)
    start = st.saved()
    spent = _kicks(st, deadline, effort // 2, seed, 0)
    first, got = st.saved(), st.value()
    st.restore(start)
    spent += _kicks(st, deadline, effort - effort // 2, seed, 1)
    if got >= st.value():
        st.restore(first)
    return spent


def _kicks(st: Counts, deadline: float, effort: int, seed: int, way: int) -> int:
    """Iterated local search on the counts (`kernels.kicks`; `way` 0: a kick's refills
    share a node's cores, 1: in turn) in `_KICK_CHUNKS` calls of
    an equal share of `effort`, until the deadline or `KICK_STALL` kicks in a row gain
    nothing (`KICK_STALL_SMALL` / GPUs on clusters under 16). Returns the effort spent.

    Why: the pairs stop where no single pair of GPUs gains, and on bench_policies'
    46 instances (SP3, SP4 and seeds 0-10 of the heterogeneous mixes) that left 6 below
    99 % of CP-SAT's 20 s plan, the worst at 97.5 %. What would lift them moves several
    classes between architectures at once, through plans of less value that a pair
    never accepts. Kicks of three GPUs with the pairs among them, 800,000 units (12 ms
    more per decision, median, compiled, on a 2-core machine), left 1 of 46 below 99 %
    (docs/policies.md)."""
    fn = _kernel("kicks", st)
    saved = st.new(3 * st.C, 0)
    snap = st.new(kernels.snap_size(KICK_WIDTH, st.C), 0)
    noisy = st.new(st.C, 0)
    picks = st.new(KICK_WIDTH, 0)
    # Kicks since the last gain, kicks, the last kick that gained, the way of refilling
    # (0: sharing a node's cores).
    state = st.new(4, 0)
    state[3] = way
    share = max(1, effort // _KICK_CHUNKS)
    stall = max(KICK_STALL, KICK_STALL_SMALL // max(1, st.G))
    spent = 0
    for chunk in range(_KICK_CHUNKS):
        if spent >= effort or state[0] >= stall or time.perf_counter() > deadline:
            break
        r = fn(st.G, st.C, *st.cols, min(share, effort - spent), st.work, saved, snap, noisy,
               picks, seed * _KICK_CHUNKS + chunk, KICK_WIDTH, KICK_NOISE, stall, state)
        spent += r % kernels.GAINED
    return spent
