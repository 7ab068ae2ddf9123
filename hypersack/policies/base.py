"""The policy interface and its snapshot types, in integer units so that sums are exact.

Compute is in hundredths of a percent of one GPU (10000 = 100 %), memory in MiB, cores
in thousandths of a core. A GPU's compute capacity is already scaled by its
oversubscription ratio. Demands are rounded up and capacities down when converted.

What a plan maximizes is the work it places: the sum of the placed items' values. An
item's value is the same on every architecture, so no plan gains by putting a trial on
slower hardware (where the same trial needs more percent of a GPU): by default it is
the item's compute demand on the architecture where that demand is largest (the
slowest one it is profiled on), and at least one unit, so a trial that needs no compute
still counts. A fused group's value is its members' (K trials' work, not the group's
smaller demand).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from hypersack.core.types import Demand, ceil_units, floor_units
from hypersack.policies.columns import Columns, JoinedColumns

# Importers that found these here before they moved to policies/columns.py still do.
from hypersack.policies.columns import FitBounds as FitBounds
from hypersack.policies.columns import fits_empty as fits_empty

COMPUTE_SCALE = 100  # units per compute percent
CORE_SCALE = 1000  # units per core


class Need(NamedTuple):
    compute: int
    memory: int
    cores: int

    @classmethod
    def of(cls, demand: Demand) -> Need:
        return cls(ceil_units(demand.compute_pct, COMPUTE_SCALE), demand.memory_mib,
                   ceil_units(demand.cores, CORE_SCALE))


def compute_capacity(ratio: float) -> int:
    """Scaled compute of one GPU: ratio x 100 %, in units."""
    return floor_units(ratio * 100.0, COMPUTE_SCALE)


def core_units(cores: float) -> int:
    return floor_units(cores, CORE_SCALE)


NO_SPEED: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True)
class Item:
    """One placement item (a trial or a fused group), its need per architecture, its
    expected run time (the longest over architectures), its value (see above; -1:
    derived from the needs) and its relative speed per architecture (its run time on
    the slowest architecture over its run time on this one; empty where unknown)."""

    id: str
    needs: Mapping[str, Need]
    run_time_s: float = 0.0
    value: int = -1
    # One shared empty mapping by default: items are grouped by their mappings' identity.
    speed: Mapping[str, float] = field(default_factory=lambda: NO_SPEED)

    def __post_init__(self) -> None:
        if self.value < 0:
            object.__setattr__(self, "value", default_value(self.needs))


def run_time_and_speed(times: Mapping[str, float]) -> tuple[float, dict[str, float]]:
    """An item's run time (its longest over architectures) and its speed on each (that
    over its run time there; empty where it is known on one architecture only)."""
    run_time = max(times.values(), default=0.0)
    speed = {a: run_time / s for a, s in times.items() if s > 0} \
        if len(times) > 1 and run_time > 0 else {}
    return run_time, speed


def default_value(needs: Mapping[str, Need]) -> int:
    """An item's work: its largest compute demand over architectures, at least 1."""
    return max(1, max(n.compute for n in needs.values())) if needs else 0


@dataclass(frozen=True)
class GpuBin:
    node: str
    index: int
    arch: str
    compute: int  # free scaled compute
    memory: int  # free MiB
    total_compute: int = -1  # scaled compute when empty (-1: same as free)
    total_memory: int = -1
    slots: int | None = None  # how many more items it may take (None: no limit)

    @property
    def full_compute(self) -> int:
        """Scaled compute when empty."""
        return self.total_compute if self.total_compute >= 0 else self.compute

    @property
    def full_memory(self) -> int:
        """MiB when empty."""
        return self.total_memory if self.total_memory >= 0 else self.memory


_NO_LIMIT = 1 << 60  # a GPU's slots when it has no limit


@dataclass(frozen=True)
class NodeBin:
    name: str
    cores: int  # free core units
    gpus: tuple[GpuBin, ...]
    total_cores: int = -1

    @property
    def full_cores(self) -> int:
        """Core units when nothing runs."""
        return self.total_cores if self.total_cores >= 0 else self.cores

    @functools.cached_property
    def columns(self) -> Columns:
        """Computed once per bin: a cluster keeps an unchanged node's bin from one
        decision to the next, so a decision at a thousand nodes reads these instead of
        walking every GPU again (Flat, the orchestrator's fit bounds)."""
        gpus = self.gpus
        free: dict[tuple[str, int, int], int] = {}
        for g in gpus:
            key = (g.arch, g.compute, g.memory)
            free[key] = free.get(key, 0) + 1
        return Columns(tuple(g.arch for g in gpus), tuple(g.index for g in gpus),
                       tuple(g.compute for g in gpus), tuple(g.memory for g in gpus),
                       tuple(_NO_LIMIT if g.slots is None else g.slots for g in gpus),
                       tuple(free.items()), tuple(g.full_compute for g in gpus))


@dataclass(frozen=True)
class ClusterView:
    nodes: tuple[NodeBin, ...]
    # The same nodes' columns already joined, where the builder keeps them (see
    # JoinedColumns): valid while their `seq` is still `joined_seq`. Not init fields: a
    # view made from another (dataclasses.replace, `after`) has other nodes, and none.
    joined: JoinedColumns | None = field(default=None, init=False, compare=False,
                                         repr=False)
    joined_seq: int = field(default=-1, init=False, compare=False, repr=False)

    @classmethod
    def with_columns(cls, nodes: tuple[NodeBin, ...], joined: JoinedColumns) -> ClusterView:
        """A view of `nodes` whose columns `joined` holds, as they are now."""
        view = cls(nodes)
        object.__setattr__(view, "joined", joined)
        object.__setattr__(view, "joined_seq", joined.seq)
        return view

    def columns(self) -> JoinedColumns | None:
        """The joined columns of exactly these nodes, or None (join them)."""
        j = self.joined
        return j if j is not None and j.seq == self.joined_seq else None

    def gpus(self) -> list[GpuBin]:
        return [g for n in self.nodes for g in n.gpus]

    def node_named(self, name: str) -> NodeBin | None:
        """The node of that name, if the view has it (by the kept columns' index, or
        one built once per view: not a walk of every node per question)."""
        j = self.columns()
        if j is not None:
            i = j.position.get(name)
            return None if i is None else self.nodes[i]
        index = self.__dict__.get("_by_name")
        if index is None:
            index = {n.name: n for n in self.nodes}
            object.__setattr__(self, "_by_name", index)
        return index.get(name)

    def after(self, items: Sequence[Item], plan: Plan) -> ClusterView:
        """What is left free once the plan's placements hold their needs."""
        by_id = {it.id: it for it in items}
        arch = {(n.name, g.index): g.arch for n in self.nodes for g in n.gpus}
        taken: dict[tuple[str, int], list[Need]] = {}
        for p in plan.placements:
            taken.setdefault((p.node, p.gpu_index), []).append(
                by_id[p.item_id].needs[arch[p.node, p.gpu_index]])
        nodes = []
        for n in self.nodes:
            gpus = []
            cores = n.cores
            for g in n.gpus:
                needs = taken.get((n.name, g.index), [])
                cores -= sum(x.cores for x in needs)
                slots = None if g.slots is None else max(0, g.slots - len(needs))
                gpus.append(replace(g, compute=max(0, g.compute - sum(x.compute for x in needs)),
                                    memory=max(0, g.memory - sum(x.memory for x in needs)),
                                    slots=slots))
            nodes.append(replace(n, cores=max(0, cores), gpus=tuple(gpus)))
        return ClusterView(nodes=tuple(nodes))


@dataclass(frozen=True)
class Placement:
    item_id: str
    node: str
    gpu_index: int


@dataclass(frozen=True)
class Plan:
    placements: tuple[Placement, ...]
    unplaced: tuple[str, ...]
    solve_time_s: float
    objective: int  # the placed items' values (work placed, in compute units)
    status: str = "heuristic"  # or the solver's: OPTIMAL, FEASIBLE, ...
    bound: int | None = None  # a proven upper bound on the objective, where known
    info: dict[str, float] = field(default_factory=dict)

    def gap(self) -> float | None:
        """Proven relative gap to the optimum, where the policy knows a bound."""
        if self.bound is None:
            return None
        if self.bound <= 0:
            return 0.0
        return max(0.0, (self.bound - self.objective) / self.bound)


# An item prefers the architectures where its comparative advantage is within this
# factor of its best (so profiles that differ by noise express no preference).
ADVANTAGE_TOLERANCE = 1.1


def advantages(items: Sequence[Item]) -> list[Mapping[str, float]] | None:
    """Each item's comparative advantage per architecture, or None where no item has a
    preference (every advantage within ADVANTAGE_TOLERANCE of the item's best).

    An item's advantage on an architecture is its relative speed there over the mean
    relative speed (weighted by value) of all the items profiled there, as Gavel
    normalizes throughput: when one model gains 3x from an H100 and another 1.2x, the
    first has the advantage on the H100s and the second on the A100s, whatever the
    absolute speeds; when every model gains alike, nobody has one. An architecture
    without a speed for the item counts as 1."""
    sums: dict[str, list[float]] = {}
    for it in items:
        if len(it.speed) < 2:
            continue
        for a, v in it.speed.items():
            if a in it.needs and v > 0:
                acc = sums.setdefault(a, [0.0, 0.0])
                acc[0] += v * it.value
                acc[1] += it.value
    mean = {a: s / w for a, (s, w) in sums.items() if w > 0}
    if len(mean) < 2:
        return None
    cache: dict[tuple[int, int], Mapping[str, float]] = {}
    out: list[Mapping[str, float]] = []
    any_preference = False
    for it in items:
        key = (id(it.needs), id(it.speed))
        adv = cache.get(key)
        if adv is None:
            adv = {a: (it.speed[a] / mean[a] if a in mean and it.speed.get(a, 0.0) > 0
                       else 1.0) for a in it.needs}
            if adv and min(adv.values()) * ADVANTAGE_TOLERANCE < max(adv.values()):
                any_preference = True
            cache[key] = adv
        out.append(adv)
    return out if any_preference else None


def arch_weights(items: Sequence[Item]) -> list[Mapping[str, float]] | None:
    """What worst fit multiplies a GPU's free share by, per item and architecture: the
    item's comparative advantage there times the square root of its speed there (the
    fastest GPU also finishes the trial soonest, which matters most for the longest
    trials at the end of a study). None where no item has a comparative preference.
    The mix was chosen on scripts/sim_hetero.py's scenarios, where comparative
    advantage alone and speed alone each lost to the blind rule on one of six."""
    adv = advantages(items)
    if adv is None:
        return None
    return [{a: w * math.sqrt(max(it.speed.get(a, 1.0), 1e-9)) for a, w in x.items()}
            for it, x in zip(items, adv, strict=True)]


def preferred(items: Sequence[Item]) -> list[Item] | None:
    """Each item with its needs cut to the architectures where its comparative advantage
    (`advantages`) is within ADVANTAGE_TOLERANCE of its best, or None where no item has
    a preference."""
    adv = advantages(items)
    if adv is None:
        return None
    cut: dict[tuple[int, int], Mapping[str, Need]] = {}
    out: list[Item] = []
    for it, a in zip(items, adv, strict=True):
        key = (id(it.needs), id(it.speed))
        needs = cut.get(key)
        if needs is None:
            top = max(a.values(), default=1.0)
            keep = {arch: n for arch, n in it.needs.items()
                    if a[arch] * ADVANTAGE_TOLERANCE >= top}
            needs = cut[key] = keep if len(keep) < len(it.needs) else it.needs
        out.append(it if needs is it.needs else replace(it, needs=needs))
    return out


def arch_aware(place: Callable[[Sequence[Item], ClusterView], Plan], items: Sequence[Item],
               cluster: ClusterView,
               alone: Callable[[Sequence[Item], ClusterView], Plan] | None = None) -> Plan:
    """A policy made heterogeneity-aware: it first places every item only where it has
    the most comparative advantage (`preferred`), then what is left anywhere it fits,
    so no capacity stays idle for a preference. Where no item has a preference, one
    pass of `alone` (default: `place`) decides."""
    start = time.perf_counter()
    cut = preferred(items)
    if cut is None:
        return (alone or place)(items, cluster)
    first = place(cut, cluster)
    placed = {p.item_id for p in first.placements}
    rest = [it for it in items if it.id not in placed]
    second = place(rest, cluster.after(cut, first))
    return Plan(placements=first.placements + second.placements, unplaced=second.unplaced,
                solve_time_s=time.perf_counter() - start,
                objective=first.objective + second.objective)


class Policy(Protocol):
    name: str

    def place(self, items: Sequence[Item], cluster: ClusterView) -> Plan:
        """Choose a GPU for as many items as fit. Must not mutate its inputs."""
        ...


def _same(values: list[Any]) -> list[Any]:
    return values


class Flat:
    """The cluster as parallel lists indexed by GPU position: what the policies work on."""

    def __init__(self, cluster: ClusterView) -> None:
        # Copies: a policy's takes never reach the builder's lists.
        kept = cluster.columns()
        j = kept or JoinedColumns(cluster.nodes, count_free=False)
        # The kept columns, while this copy still equals them (see `roomy`).
        self._kept = kept
        own: Callable[[list[Any]], list[Any]] = list if kept is not None else _same
        # What no policy changes (where each GPU is, what it is) is shared, not copied:
        # at 8,000 GPUs the copies were a fifth of an exit's decision.
        self.node_names: list[str] = j.node_names
        self.node_of: list[int] = j.node_of
        self.arch: list[str] = j.arch
        self.index: list[int] = j.index
        self.node_cores: list[int] = own(j.node_cores)
        self.compute: list[int] = own(j.compute)
        self.memory: list[int] = own(j.memory)
        self.slots: list[int] = own(j.slots)
        # Read only (never taken from): shared, not copied.
        self.full_compute: list[int] = j.full

    def __len__(self) -> int:
        return len(self.arch)

    def fits(self, g: int, need: Need) -> bool:
        return (self.compute[g] >= need.compute and self.memory[g] >= need.memory
                and self.slots[g] > 0 and self.node_cores[self.node_of[g]] >= need.cores)

    def roomy(self, compute: int) -> list[int]:
        """The positions of the GPUs with at least `compute` free: read from the kept
        columns' order while nothing was taken (a policy asks before it places), else
        by walking every GPU."""
        if self._kept is not None:
            return self._kept.roomy(compute)
        return [g for g, c in enumerate(self.compute) if c >= compute]

    def take(self, g: int, need: Need) -> None:
        self._kept = None
        self.compute[g] -= need.compute
        self.memory[g] -= need.memory
        self.slots[g] -= 1
        self.node_cores[self.node_of[g]] -= need.cores

    def give(self, g: int, need: Need) -> None:
        """Undo `take`."""
        self._kept = None
        self.compute[g] += need.compute
        self.memory[g] += need.memory
        self.slots[g] += 1
        self.node_cores[self.node_of[g]] += need.cores

    def placement(self, item_id: str, g: int) -> Placement:
        return Placement(item_id, self.node_names[self.node_of[g]], self.index[g])


def classes(items: Sequence[Item]) -> tuple[list[Item], list[list[int]]]:
    """Interchangeable items (identical value, needs and speeds), in first-seen order: one
    representative item per class and the indices of its members, longest run first."""
    index: dict[tuple[int, int, int], int] = {}
    sig: dict[tuple[int, int], tuple[object, ...]] = {}
    by_sig: dict[tuple[int, tuple[object, ...]], int] = {}
    reps: list[Item] = []
    members: list[list[int]] = []
    for i, it in enumerate(items):
        # Items of one workload share one needs (and speed) mapping: sorted once per
        # mapping.
        quick = (it.value, id(it.needs), id(it.speed))
        c = index.get(quick)
        if c is None:
            s = sig.get(quick[1:])
            if s is None:
                s = sig[quick[1:]] = (tuple(sorted(it.needs.items())),
                                      tuple(sorted(it.speed.items())))
            c = by_sig.get((it.value, s))
            if c is None:
                c = by_sig[(it.value, s)] = len(reps)
                reps.append(it)
                members.append([])
            index[quick] = c
        members[c].append(i)
    for its in members:
        its.sort(key=lambda i: -items[i].run_time_s)  # stable: ties keep their order
    return reps, members


def __getattr__(name: str) -> object:
    """The plan checks moved to policies/plans.py; a plug-in that imports them from here
    still finds them."""
    if name in ("PlanError", "check_plan", "why_unplaced"):
        from hypersack.policies import plans
        return getattr(plans, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
