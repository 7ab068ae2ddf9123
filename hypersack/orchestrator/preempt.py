"""Preemption: a study with `preempt: true` that still waits stops trials of lower
priority where that lets its trials fit."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from dataclasses import replace

from hypersack.core.types import (
    TrialRecord,
)
from hypersack.orchestrator import shares
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.cluster import CORES, DRAINING, NOTHING, PROFILING, Gpu, Node
from hypersack.orchestrator.commands import (
    Command,
    KillTrial,
)
from hypersack.orchestrator.cycle import CycleState
from hypersack.orchestrator.decide import Decider
from hypersack.orchestrator.state import CoreState
from hypersack.policies.base import (
    ClusterView,
    Need,
    compute_capacity,
)

log = logging.getLogger(__name__)


class Preemption:
    def __init__(self, s: CoreState, book: Book, decider: Decider) -> None:
        self.s = s
        self.book = book
        self.decider = decider

    def preempt(self, cycle: CycleState, open_nodes: list[Node], archs: frozenset[str]
                 ) -> list[Command]:
        """For each study with `preempt: true` that still waits, highest priority first:
        stop trials of lower-priority studies where that lets its trials fit."""
        commands: list[Command] = []
        priority = {c.study_id: c.priority for c in cycle.claims}
        for c in sorted(cycle.claims, key=lambda c: (-c.priority, c.seq)):
            if not (c.pending and self.s.spaces[c.study_id].settings.preempt):
                continue
            victims = {tid: self.s.trials[tid] for node in open_nodes
                       for gpu in node.gpus.values() for tid in gpu.trials
                       if priority.get(self.s.trials[tid].study_id, c.priority) < c.priority}
            if not victims:
                continue
            try:
                with cycle.attempt(c) as (mine, quota), self.s.undone_if_raises():
                    commands += self.make_room(mine, victims, priority, open_nodes, archs,
                                                quota)
            except Exception as exc:
                if self.s.store.failed(exc):
                    raise
                self.s.decide_again = True
                log.exception("preempting for study %s failed and was undone", c.study_id)
        return commands

    def make_room(self, claim: shares.Claim, victims: dict[str, TrialRecord],
                   priority: Mapping[str, int], open_nodes: list[Node],
                   archs: frozenset[str], quota: shares.Quota) -> list[Command]:
        """Place the study's waiting trials (alone, not fused), largest first, each on the
        GPU where it needs the fewest of the victims stopped (none where it fits now),
        then where those lose the least work; on that GPU stop just those (lowest
        priority first, then the latest started)."""
        space = self.s.spaces[claim.study_id]
        ratios = space.settings.oversubscription
        open_nodes = self.s.nodes_for(claim.study_id, open_nodes)
        view = _freed(self.s.cluster.view(open_nodes, ratios), victims)
        pending = self.book.pending_of(claim.study_id)
        batch = self.decider.plain_items(claim.study_id, pending, archs, view)
        if not batch:
            return []
        now = self.s.clock.now()
        stops: list[Command] = []
        launches: list[Command] = []
        why = f"preempted by study {claim.study_id} (priority {claim.priority})"
        for item in sorted(batch, key=lambda it: (-it.value, it.id)):
            best: tuple[tuple[int, float, str, int], Node, int, list[TrialRecord]] | None \
                = None
            for node in open_nodes:
                for idx, gpu in sorted(node.gpus.items()):
                    need = item.needs.get(gpu.arch)
                    if need is None or not quota.allows(
                            (node.spec.name, idx), self.decider.cost(need.compute, gpu.arch)):
                        continue
                    cap = compute_capacity(self.s.config.ratio(gpu.arch, ratios))
                    chosen = self.stops_for(node, gpu, need, cap, victims, priority)
                    if chosen is None:
                        continue
                    lost = sum(now - (t.started_at or now) for t in chosen)
                    key = (len(chosen), lost, node.spec.name, idx)
                    if best is None or key < best[0]:
                        best = (key, node, idx, chosen)
            if best is None:
                continue
            _, node, idx, chosen = best
            for victim in chosen:
                for member in self.book.with_group(victim):
                    if victims.pop(member.id, None) is not None:
                        stops.append(self.stop(member, why))
            gpu = node.gpus[idx]
            need = item.needs[gpu.arch]
            if self.s.cluster.shortfalls(node, gpu, need, compute_capacity(
                    self.s.config.ratio(gpu.arch, ratios))):
                continue  # a fused group's memory stays held until its process ends
            cost = self.decider.cost(need.compute, gpu.arch)
            quota.take((node.spec.name, idx), cost)
            claim.used += cost
            launches.append(self.decider.launch(self.s.trials[item.id], node.spec.name, idx))
        if stops:
            log.info("study %s: stopped %d trial(s) of lower priority to launch %d",
                     claim.study_id, len(stops), len(launches))
        claim.pending = self.book.has_pending(claim.study_id)
        return stops + launches  # the stops first: the agent frees the GPU, then launches

    def stops_for(self, node: Node, gpu: Gpu, need: Need, cap: int,
                   victims: Mapping[str, TrialRecord], priority: Mapping[str, int]
                   ) -> list[TrialRecord] | None:
        """The victims to stop, in `_victim`'s order, for `need` to fit on `gpu` (none:
        it fits now); None where stopping every victim there would not do."""
        chosen: list[TrialRecord] = []
        taken: set[str] = set()  # chosen already (no copy of every victim per GPU tried)
        freed, leaving = NOTHING, 0  # what the chosen hold there
        while short := self.s.cluster.shortfalls(node, gpu, need, cap, freed=freed,
                                                 leaving=leaving):
            if PROFILING in short or DRAINING in short:
                return None  # no trial's stop frees a GPU from its profile job
            victim = _victim(node, gpu, short != [CORES], victims, priority, taken)
            if victim is None or victim.demand is None:
                return None
            taken.add(victim.id)
            chosen.append(victim)
            held = Need.of(victim.demand)
            here = victim.gpu_index == gpu.spec_index
            freed = Need(freed.compute + held.compute * here,
                         freed.memory + held.memory * here, freed.cores + held.cores)
            leaving += here
        return chosen

    def stop(self, t: TrialRecord, why: str) -> KillTrial:
        """Stop a running trial and put it back to wait, with no failure counted. Its
        attempt's exit, when it comes, is stale: the trial no longer names that node."""
        assert t.node is not None
        kill = KillTrial(t.id, t.node, why, attempt=t.launches)
        self.book.release(t.id)
        self.book.requeue(self.s.trials[t.id], launched_on=None, reason=why)
        log.info("%s %s", t.id, why)
        return kill


def _freed(view: ClusterView, victims: Mapping[str, TrialRecord]) -> ClusterView:
    """The view as if the victims' trials held nothing."""
    gpu_back: dict[tuple[str, int], Need] = {}
    node_back: dict[str, int] = {}
    for t in victims.values():
        if t.demand is None or t.node is None or t.gpu_index is None:
            continue
        n = Need.of(t.demand)
        key = (t.node, t.gpu_index)
        old = gpu_back.get(key, Need(0, 0, 0))
        gpu_back[key] = Need(old.compute + n.compute, old.memory + n.memory, 0)
        node_back[t.node] = node_back.get(t.node, 0) + n.cores
    nodes = []
    for node in view.nodes:
        gpus = []
        for g in node.gpus:
            back = gpu_back.get((node.name, g.index))
            if back is not None:
                g = replace(g, compute=min(g.full_compute, g.compute + back.compute),
                            memory=min(g.full_memory, g.memory + back.memory))
            gpus.append(g)
        nodes.append(replace(node, gpus=tuple(gpus),
                             cores=min(node.full_cores, node.cores + node_back.get(node.name, 0))))
    return ClusterView(nodes=tuple(nodes))


def _victim(node: Node, gpu: Gpu, gpu_short: bool, victims: Mapping[str, TrialRecord],
            priority: Mapping[str, int], taken: AbstractSet[str]) -> TrialRecord | None:
    """The next trial to stop for a need to fit on `gpu`, among the victims not `taken`
    yet: on that GPU while the GPU is short, anywhere on the node while only its cores
    are; lowest priority first, then the latest started."""
    where = gpu.trials if gpu_short else {tid for g in node.gpus.values() for tid in g.trials}
    found = [victims[tid] for tid in where if tid in victims and tid not in taken]
    if not found:
        return None
    return min(found, key=lambda t: (priority.get(t.study_id, 0), -(t.started_at or 0.0),
                                     t.id))
