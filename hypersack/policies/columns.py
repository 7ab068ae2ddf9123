"""A cluster view's GPUs as columns: a node's (`Columns`, cached on its bin), all the
nodes' joined and patched node by node as they change (`JoinedColumns`, kept by the
cluster across decisions), and what the orchestrator reads from them before placing
(`FitBounds`, `fits_empty`). Nothing here walks every GPU of a thousand nodes per
decision.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections.abc import Mapping, Sequence
from functools import cached_property
from itertools import chain, repeat
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from hypersack.policies.base import ClusterView, Item, Need, NodeBin


class Columns(NamedTuple):
    """A node's GPUs as columns, in its order (what Flat concatenates), and its GPUs'
    distinct free states with how many GPUs are in each."""
    arch: tuple[str, ...]
    indexes: tuple[int, ...]
    compute: tuple[int, ...]
    memory: tuple[int, ...]
    slots: tuple[int, ...]
    free: tuple[tuple[tuple[str, int, int], int], ...]  # ((arch, compute, memory), GPUs)
    full: tuple[int, ...]  # scaled compute when empty (GpuBin.full_compute)


class JoinedColumns:
    """The nodes' columns joined in one set of lists (what Flat copies), with the free
    states counted over them (what FitBounds reads), kept by whoever builds views
    (ClusterState) and patched node by node as nodes change: a decision at a thousand
    nodes then copies lists instead of joining a thousand nodes' columns. `seq` counts
    the patches: a view made before the last one no longer matches (ClusterView.joined)."""

    def __init__(self, nodes: Sequence[NodeBin], count_free: bool = True) -> None:
        cols = [n.columns for n in nodes]
        self.seq = 0
        self.node_names = [n.name for n in nodes]
        self.node_cores = [n.cores for n in nodes]
        self.offsets: list[int] = []
        at = 0
        for c in cols:
            self.offsets.append(at)
            at += len(c.arch)

        def joined(name: str) -> list[Any]:
            return list(chain.from_iterable(map(attrgetter(name), cols)))

        self.node_of: list[int] = list(chain.from_iterable(
            map(repeat, range(len(cols)), (len(c.arch) for c in cols))))
        self.arch: list[str] = joined("arch")
        self.index: list[int] = joined("indexes")
        self.compute: list[int] = joined("compute")
        self.memory: list[int] = joined("memory")
        self.slots: list[int] = joined("slots")
        self.full: list[int] = joined("full")
        # (free compute negated, GPU), most free first: built when first asked for, then
        # patched with the columns (see `by_free`).
        self._by_free: list[tuple[int, int]] | None = None
        self.free: dict[tuple[str, int, int], int] = {}
        # Per architecture, the distinct free states of `free` as (compute, memory)
        # negated, most free first: built when first asked for, then kept in step with
        # `free` (see `states`).
        self._states: dict[str, list[tuple[int, int]]] | None = None
        if count_free:
            for c in cols:
                self._count(c, 1)

    def _count(self, cols: Columns, sign: int) -> None:
        free = self.free
        states = self._states
        for key, n in cols.free:
            was = free.get(key, 0)
            left = was + sign * n
            if left:
                free[key] = left
            else:
                del free[key]
            if states is not None and (not was or not left):
                arch, compute, memory = key
                order = states.setdefault(arch, [])
                if left:
                    insort(order, (-compute, -memory))
                else:
                    del order[bisect_right(order, (-compute, -memory)) - 1]

    def patch(self, i: int, old: NodeBin, new: NodeBin) -> None:
        """Node `i` changed from `old` to `new` (same name, same GPUs)."""
        a, b = old.columns, new.columns
        start = self.offsets[i]
        end = start + len(a.arch)
        order = self._by_free
        if order is not None:
            for g, was, now in zip(range(start, end), a.compute, b.compute, strict=True):
                if was != now:
                    del order[bisect_right(order, (-was, g)) - 1]
                    insort(order, (-now, g))
        self.compute[start:end] = b.compute
        self.memory[start:end] = b.memory
        self.slots[start:end] = b.slots
        self.full[start:end] = b.full
        self.node_cores[i] = new.cores
        self._count(a, -1)
        self._count(b, 1)
        self.seq += 1

    def states(self) -> dict[str, list[tuple[int, int]]]:
        """Per architecture, its GPUs' distinct free states (compute, memory), negated,
        most free compute first; how many GPUs are in each is `free`. Read-only to the
        caller. Kept in step with the patches: where first fit leaves thousands of GPUs
        each in a state of its own, sorting them for every decision cost milliseconds."""
        if self._states is None:
            self._states = _sorted_states(self.free)
        return self._states

    @cached_property
    def position(self) -> dict[str, int]:
        """Node name -> its place (names never change with the patches): built when
        first asked for, so the columns a policy joins for a view of its own pay nothing."""
        return {name: i for i, name in enumerate(self.node_names)}

    def by_free(self) -> list[tuple[int, int]]:
        """Every GPU as (its free compute negated, its position), most free first: the
        GPUs with room for a need are a prefix of it, found by bisection (a decision at
        8,000 GPUs, most of them full, then looks at the few with room instead of all).
        Read-only to the caller."""
        if self._by_free is None:
            self._by_free = sorted((-c, g) for g, c in enumerate(self.compute))
        return self._by_free

    def roomy(self, compute: int) -> list[int]:
        """The positions of the GPUs with at least `compute` free, most free first."""
        order = self.by_free()
        return [g for _, g in order[:bisect_right(order, (-compute, len(order)))]]


def _sorted_states(counts: Mapping[tuple[str, int, int], int]
                   ) -> dict[str, list[tuple[int, int]]]:
    """Per architecture, the distinct free states as (compute, memory) negated, sorted:
    most free compute first."""
    states: dict[str, list[tuple[int, int]]] = {}
    for arch, compute, memory in counts:
        states.setdefault(arch, []).append((-compute, -memory))
    for order in states.values():
        order.sort()
    return states


class FitBounds:
    """Upper bounds on how many items of given needs fit in one view (`bound`, plus
    one). Each architecture's distinct free states (most free compute first, with how
    many GPUs are in each) are read from the nodes' cached columns, so a need stops at
    the first state too full for one item instead of walking every GPU of the cluster
    (at 8,000 GPUs, sorting them all took a tenth of a decision)."""

    def __init__(self, view: ClusterView) -> None:
        j = view.columns()
        if j is not None:
            self._counts, self._states = j.free, j.states()
            return
        counts: dict[tuple[str, int, int], int] = {}  # a view of its own: counted here
        for node in view.nodes:
            for key, n in node.columns.free:
                counts[key] = counts.get(key, 0) + n
        self._counts, self._states = counts, _sorted_states(counts)

    def bound(self, needs: Mapping[str, Need]) -> int:
        total = 0
        big = 1 << 30
        counts = self._counts
        for arch, need in needs.items():
            states = self._states.get(arch)
            if not states:
                continue
            if need.compute <= 0 and need.memory <= 0:
                return big
            for negated_compute, negated_memory in states:
                compute, memory = -negated_compute, -negated_memory
                n = counts[arch, compute, memory]
                if need.compute > 0:
                    if compute < need.compute:
                        break  # sorted: no GPU after this holds one
                    by_compute = compute // need.compute
                else:
                    by_compute = big
                total += n * min(by_compute, memory // need.memory if need.memory > 0
                                 else big)
        return total + 1


def fits_empty(item: Item, view: ClusterView) -> bool:
    """Whether the item fits some GPU of the view once that GPU and its node are empty."""
    for node in view.nodes:
        for g in node.gpus:
            need = item.needs.get(g.arch)
            if need is not None and need.compute <= g.full_compute and \
                    need.memory <= g.full_memory and need.cores <= node.full_cores:
                return True
    return False
