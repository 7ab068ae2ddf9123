"""Cluster state and capacity accounting: the nodes the orchestrator knows, what each GPU
and node has given out, and the view a policy places into.

Every change goes through the journal (the nodes are a journaled dict, and a node is
touched before it changes in place), so a refused event leaves no trace here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hypersack.core.errors import StaleEvent
from hypersack.core.types import Demand, NodeRecord, NodeSpec
from hypersack.orchestrator.journal import Journal, journaled
from hypersack.policies.base import (
    ClusterView,
    GpuBin,
    Need,
    NodeBin,
    compute_capacity,
    core_units,
)
from hypersack.policies.columns import JoinedColumns
from hypersack.sampler.planning import GpuSlot, Slot

# What keeps a need off a GPU: the answers of the one fit rule (`ClusterState.shortfalls`).
PROFILING = "profiling"  # it runs a profile job
DRAINING = "draining"  # it drains for a profile job
EXCLUSIVE = "exclusive"  # one trial per GPU, and it has one
COMPUTE = "compute"
MEMORY = "memory"
CORES = "cores"  # its node's
NOTHING = Need(0, 0, 0)


@dataclass
class Gpu:
    spec_index: int
    arch: str
    memory_mib: int
    used_compute: int = 0
    used_memory: int = 0
    # Replaced, never changed in place: the journal's save keeps it without a copy (a
    # copy of every GPU's set at each exit was a tenth of the event worker's time).
    trials: frozenset[str] = frozenset()
    profiling: Slot | None = None  # the profile job it runs
    reserved_for: Slot | None = None  # a profile job waits for it to drain


@dataclass
class Node:
    spec: NodeSpec
    draining: bool
    last_seen: float
    used_cores: int = 0
    gpus: dict[int, Gpu] = field(default_factory=dict)
    # Bumped by every change that the view shows (and by a rollback), never lowered: the
    # view keeps each node's bins until it changes.
    version: int = 0
    _archs: tuple[str, ...] | None = None
    # Its last heartbeat that changed nothing and found nothing missing, and its version
    # then: the same list again, with the node unchanged, would change nothing either
    # (see Membership.reconcile).
    quiet: tuple[int, tuple[Any, ...]] | None = None

    def save(self) -> tuple[Any, ...]:
        """What the journal keeps to undo changes made in place. Not `last_seen`: that a
        node was heard from is a fact of its link, not a change an undone batch takes
        back (after a store outage longer than the heartbeat timeout, every node would
        otherwise look silent)."""
        return (self.draining, self.used_cores,
                {i: (g.used_compute, g.used_memory, g.trials, g.profiling, g.reserved_for)
                 for i, g in self.gpus.items()})

    def restore(self, saved: tuple[Any, ...]) -> None:
        self.version += 1
        self.draining, self.used_cores, gpus = saved
        for i, (compute, memory, trials, profiling, reserved) in gpus.items():
            g = self.gpus[i]
            g.used_compute, g.used_memory, g.trials = compute, memory, trials
            g.profiling, g.reserved_for = profiling, reserved

    @property
    def name(self) -> str:
        return self.spec.name

    def archs(self) -> tuple[str, ...]:
        """Its GPUs' architectures, in index order (fixed for the node's life)."""
        archs = self._archs
        if archs is None:
            archs = self._archs = tuple(self.gpus[i].arch for i in sorted(self.gpus))
        return archs

    def record(self) -> NodeRecord:
        return NodeRecord(spec=self.spec, draining=self.draining)

    @classmethod
    def of(cls, record: NodeRecord, last_seen: float) -> Node:
        node = cls(spec=record.spec, draining=record.draining, last_seen=last_seen)
        for g in record.spec.gpus:
            node.gpus[g.index] = Gpu(g.index, g.arch, g.memory_mib)
        return node


class OpenNodes(list[Node]):
    """The open nodes, as `ClusterState.open_nodes` gives them: its views of this list
    are kept from one decision to the next while the membership stays (`epoch`)."""

    epoch = -1


@dataclass
class _KeptView:
    """A view of the open nodes at some ratios, patched node by node as they change
    (dropped at any membership change)."""

    bins: list[NodeBin]
    joined: JoinedColumns  # its `position`: a node name's place in `bins`
    changed: set[str] = field(default_factory=set)  # touched since it was patched
    view: ClusterView | None = None  # the last one handed out, while nothing changed


class ClusterState:
    """The nodes and their capacity. `ratio(arch, study_ratios)` scales a GPU's compute."""

    def __init__(self, journal: Journal,
                 ratio: Callable[[str, dict[str, float]], float], exclusive: bool = False
                 ) -> None:
        self._journal = journal
        self._ratio = ratio
        self._exclusive = exclusive
        self._nodes: dict[str, Node] = journaled(journal)
        # node name -> (the Node object, its version, its GPUs' scaled capacities, its bins)
        self._bins: dict[str, tuple[Node, int, tuple[int, ...], NodeBin]] = {}
        # The open nodes by name and their architectures: asked by every decision cycle
        # (hundreds a second at a thousand nodes), changed only when a node joins,
        # leaves or drains, or a batch is undone.
        self._open: tuple[list[Node], frozenset[str], int] | None = None
        self._owners: frozenset[str] | None = None
        self._epoch = 0  # membership changes (joins, leaves, drains, undone batches)
        # Views of the open nodes kept across decisions, per ratios in force (a few:
        # the server's, and those of studies with their own).
        self._kept: dict[tuple[tuple[str, int], ...], _KeptView] = {}
        self.profile_jobs = ProfileJobs(self)
        journal.on_rollback(self._membership_changed)

    # ----------------------------------------------------------------- membership
    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def __iter__(self) -> Iterator[Node]:
        return iter(self._nodes.values())

    def __len__(self) -> int:
        return len(self._nodes)

    def get(self, name: str | None) -> Node | None:
        return self._nodes.get(name or "")

    def live(self, name: str) -> Node:
        """The node an agent's event comes from; a stale event if it is not registered."""
        node = self._nodes.get(name)
        if node is None:
            raise StaleEvent(f"node {name!r} is not registered")
        return node

    def gpu(self, name: str | None, index: int | None) -> Gpu | None:
        node = self.get(name)
        return node.gpus.get(index if index is not None else -1) if node else None

    def add(self, record: NodeRecord, last_seen: float) -> Node:
        node = self._nodes[record.spec.name] = Node.of(record, last_seen)
        self._membership_changed()
        return node

    def remove(self, name: str) -> Node:
        node = self._nodes[name]
        self.touch(node)
        del self._nodes[name]
        self._bins.pop(name, None)
        self._membership_changed()
        return node

    def set_draining(self, node: Node, draining: bool) -> None:
        self.touch(node)
        node.draining = draining
        self._membership_changed()

    def _membership_changed(self) -> None:
        self._open = None
        self._owners = None
        self._epoch += 1
        self._kept.clear()
        self.profile_jobs.changed()

    def owners(self) -> frozenset[str]:
        """The owners the nodes are kept for ("": anyone's), over every node: a decision
        asks it per study, instead of asking each of a thousand nodes."""
        if self._owners is None:
            self._owners = frozenset(n.spec.owner for n in self._nodes.values())
        return self._owners

    def touch(self, node: Node) -> None:
        """Call before changing a node in place."""
        self._journal.touch(node)
        node.version += 1
        for kept in self._kept.values():
            kept.changed.add(node.name)

    def seen(self, node: Node, now: float) -> None:
        """The node was heard from (kept even if the batch is undone; see Node.save)."""
        node.last_seen = now

    def silent(self, now: float, timeout_s: float) -> list[str]:
        """Nodes that have sent nothing for longer than the timeout."""
        return [n for n, node in self._nodes.items() if now - node.last_seen > timeout_s]

    @staticmethod
    def archs_of(nodes: list[Node]) -> frozenset[str]:
        """The GPU architectures these nodes have."""
        return frozenset().union(*[n.archs() for n in nodes])

    def _opened(self) -> tuple[list[Node], frozenset[str], int]:
        if self._open is None:
            nodes = [n for _, n in sorted(self._nodes.items()) if not n.draining]
            self._open = nodes, self.archs_of(nodes), sum(len(n.gpus) for n in nodes)
        return self._open

    def open_nodes(self) -> list[Node]:
        """Nodes that take new work, by name (a list of the caller's own)."""
        nodes = OpenNodes(self._opened()[0])
        nodes.epoch = self._epoch
        return nodes

    def open_archs(self) -> frozenset[str]:
        """The open nodes' GPU architectures."""
        return self._opened()[1]

    def open_gpus(self) -> int:
        """How many GPUs the open nodes have."""
        return self._opened()[2]

    def largest_memory_mib(self) -> int:
        return max((g.memory_mib for n in self._nodes.values() for g in n.gpus.values()),
                   default=0)

    # ----------------------------------------------------------------- the fit rule
    def shortfalls(self, node: Node, gpu: Gpu, need: Need, cap: int, *,
                   freed: Need = NOTHING, leaving: int = 0, empty: bool = False
                   ) -> list[str]:
        """The one fit rule: what keeps `need` off `gpu` of `node` now (nothing: it fits).
        Every question of fit asks it (decisions through the view, which shows the same
        free capacity and slots; reservations; preemption; `why`). `cap`: the GPU's scaled
        compute at the study's ratio. As if trials holding `freed` were gone (compute and
        memory on this GPU, cores on its node), `leaving` of them from this GPU; `empty`:
        as if nothing ran on the GPU and its node (whether it could ever fit)."""
        out = []
        if gpu.profiling is not None:
            out.append(PROFILING)
        if gpu.reserved_for is not None:
            out.append(DRAINING)
        used, memory, cores, trials = (0, 0, 0, 0) if empty else (
            gpu.used_compute - freed.compute, gpu.used_memory - freed.memory,
            node.used_cores - freed.cores, len(gpu.trials) - leaving)
        if self._exclusive and trials > 0:
            out.append(EXCLUSIVE)
        # Free capacity as the view shows it: never below zero (a GPU filled at another
        # study's higher ratio has nothing free, and takes only what needs nothing).
        if need.compute > max(0, cap - used):
            out.append(COMPUTE)
        if need.memory > max(0, gpu.memory_mib - memory):
            out.append(MEMORY)
        if need.cores > max(0, core_units(node.spec.cores) - cores):
            out.append(CORES)
        return out

    # ----------------------------------------------------------------- accounting
    def allocate(self, trial_id: str, node: Node, gpu: Gpu, demand: Demand) -> None:
        need = Need.of(demand)
        self.touch(node)
        gpu.used_compute += need.compute
        gpu.used_memory += need.memory
        node.used_cores += need.cores
        gpu.trials = gpu.trials | {trial_id}

    def release(self, trial_id: str, node_name: str | None, gpu_index: int | None,
                demand: Demand | None) -> None:
        """Give back what a trial held, if it holds anything there."""
        node = self.get(node_name)
        gpu = self.gpu(node_name, gpu_index)
        if node is None or gpu is None or demand is None or trial_id not in gpu.trials:
            return
        self.touch(node)
        need = Need.of(demand)
        gpu.used_compute -= need.compute
        gpu.used_memory -= need.memory
        node.used_cores -= need.cores
        gpu.trials = gpu.trials - {trial_id}

    def gpu_load(self) -> dict[tuple[str, int], tuple[int, float]]:
        """(node, GPU index) -> (trials running, scaled-compute share used, 0..1)."""
        out = {}
        for node in self._nodes.values():
            for idx, gpu in node.gpus.items():
                cap = compute_capacity(self._ratio(gpu.arch, {}))
                out[node.name, idx] = (len(gpu.trials), gpu.used_compute / cap if cap else 0.0)
        return out

    def view(self, nodes: list[Node], study_ratios: dict[str, float]) -> ClusterView:
        """What is free, as a policy sees it, with a study's own ratios. A node's bins are
        built again only after it changed (its version) or for other ratios: with 200
        nodes, rebuilding all of them was most of a decision's time. A view of the open
        nodes as `open_nodes` gave them is kept whole and patched where nodes changed,
        its columns joined (JoinedColumns): at a thousand nodes, walking them all to
        find the one that changed was a third of a decision."""
        caps: dict[str, int] = {}

        def cap_of(arch: str) -> int:
            cap = caps.get(arch)
            if cap is None:
                cap = caps[arch] = compute_capacity(self._ratio(arch, study_ratios))
            return cap

        if isinstance(nodes, OpenNodes) and nodes.epoch == self._epoch:
            return self._kept_view(nodes, cap_of)
        capkeys: dict[tuple[str, ...], tuple[int, ...]] = {}
        return ClusterView(nodes=tuple(self._bin(node, cap_of, capkeys) for node in nodes))

    def _kept_view(self, nodes: OpenNodes, cap_of: Callable[[str], int]) -> ClusterView:
        key = tuple((arch, cap_of(arch)) for arch in sorted(self._opened()[1]))
        capkeys: dict[tuple[str, ...], tuple[int, ...]] = {}
        kept = self._kept.get(key)
        if kept is None or len(kept.bins) != len(nodes):
            if len(self._kept) >= 8:  # studies with their own ratios: a few at a time
                self._kept.pop(next(iter(self._kept)))
            bins = [self._bin(node, cap_of, capkeys) for node in nodes]
            kept = self._kept[key] = _KeptView(bins, JoinedColumns(bins))
        elif kept.changed:
            for name in kept.changed:
                i = kept.joined.position.get(name)
                if i is None:
                    continue
                new = self._bin(nodes[i], cap_of, capkeys)
                old = kept.bins[i]
                if new is not old:
                    kept.bins[i] = new
                    kept.joined.patch(i, old, new)
                    kept.view = None
            kept.changed.clear()
        if kept.view is None:
            kept.view = ClusterView.with_columns(tuple(kept.bins), kept.joined)
        return kept.view

    def _bin(self, node: Node, cap_of: Callable[[str], int],
             capkeys: dict[tuple[str, ...], tuple[int, ...]]) -> NodeBin:
        """A node's bin at these capacities, built again only after it changed."""
        # The scaled capacities are part of the key: the ratios may differ by study.
        archs = node.archs()
        capkey = capkeys.get(archs)
        if capkey is None:
            capkey = capkeys[archs] = tuple(cap_of(a) for a in archs)
        cached = self._bins.get(node.name)
        if (cached is not None and cached[0] is node and cached[1] == node.version
                and cached[2] == capkey):
            return cached[3]
        bins = []
        for idx in sorted(node.gpus):
            gpu = node.gpus[idx]
            cap = cap_of(gpu.arch)
            slots: int | None = None
            if gpu.profiling is not None or gpu.reserved_for is not None:
                slots = 0
            elif self._exclusive:
                slots = max(0, 1 - len(gpu.trials))
            bins.append(GpuBin(node=node.name, index=idx, arch=gpu.arch,
                               compute=max(0, cap - gpu.used_compute),
                               memory=max(0, gpu.memory_mib - gpu.used_memory),
                               total_compute=cap, total_memory=gpu.memory_mib, slots=slots))
        total_cores = core_units(node.spec.cores)
        built = NodeBin(name=node.name, cores=max(0, total_cores - node.used_cores),
                        gpus=tuple(bins), total_cores=total_cores)
        self._bins[node.name] = (node, node.version, capkey, built)
        return built


class ProfileJobs:
    """Which GPUs run a profile job or drain for one: the profile planner's part of the
    cluster (`ClusterState.profile_jobs`). A GPU that does either takes no trials (the
    fit rule answers PROFILING or DRAINING)."""

    def __init__(self, cluster: ClusterState) -> None:
        self._cluster = cluster
        # The slots in flight and the nodes with a GPU reserved, from one walk of every
        # GPU, kept until a job starts, is reserved or ends, or the membership changes (an
        # undone batch too): asked at each node's join, a walk each made a thousand
        # joins cost millions of steps.
        self._kept: tuple[frozenset[Slot], frozenset[str]] | None = None

    def changed(self) -> None:
        self._kept = None

    def _walk(self) -> tuple[frozenset[Slot], frozenset[str]]:
        if self._kept is None:
            slots: set[Slot] = set()
            reserved: set[str] = set()
            for n in self._cluster:
                for g in n.gpus.values():
                    if g.profiling is not None:
                        slots.add(g.profiling)
                    if g.reserved_for is not None:
                        slots.add(g.reserved_for)
                        reserved.add(n.name)
            self._kept = frozenset(slots), frozenset(reserved)
        return self._kept

    def any_reserved(self) -> bool:
        """Whether an open node has a GPU reserved (draining) for a profile job."""
        return any(not node.draining for node in map(self._cluster.get, self._walk()[1])
                   if node is not None)

    def slots(self, nodes: list[Node]) -> list[GpuSlot]:
        """What profile planning needs to know of these nodes' GPUs."""
        return [GpuSlot(node=n.name, index=i, arch=g.arch, trials=len(g.trials),
                        profiling=g.profiling, reserved_for=g.reserved_for)
                for n in nodes for i, g in sorted(n.gpus.items())]

    def in_flight(self) -> frozenset[Slot]:
        """Profiles running or waiting for a GPU to drain, anywhere."""
        return self._walk()[0]

    def start(self, node: Node, gpu: Gpu, slot: Slot) -> None:
        self._cluster.touch(node)
        self.changed()
        gpu.profiling = slot
        if gpu.reserved_for == slot:
            gpu.reserved_for = None

    def reserve(self, node: Node, gpu: Gpu, slot: Slot) -> None:
        self._cluster.touch(node)
        self.changed()
        gpu.reserved_for = slot

    def running_on(self, node: str, slot: Slot) -> bool:
        """Whether the server gave this node the profile job of `slot` (and it runs)."""
        found = self._cluster.get(node)
        return found is not None and any(g.profiling == slot for g in found.gpus.values())

    def end(self, slot: Slot) -> None:
        """A profile job ended (measured or failed): its GPU takes trials again."""
        self.changed()
        for node in self._cluster:
            for gpu in node.gpus.values():
                if slot in (gpu.profiling, gpu.reserved_for):
                    self._cluster.touch(node)
                if gpu.profiling == slot:
                    gpu.profiling = None
                if gpu.reserved_for == slot:
                    gpu.reserved_for = None
