"""One decision for each active study, in the order `shares` gives, with the cycle's
claims, quotas and reservations; the policy places trials alone and fused groups."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace

from hypersack.core.types import (
    Demand,
    StudyRecord,
    TrialRecord,
    TrialState,
)
from hypersack.grid import rungs
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator import fusion, shares
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.cluster import Node
from hypersack.orchestrator.commands import (
    Command,
    LaunchGroup,
    LaunchTrial,
)
from hypersack.orchestrator.cycle import CycleState
from hypersack.orchestrator.foresight import Ask, RuleChooser
from hypersack.orchestrator.profiling import Profiling
from hypersack.orchestrator.pruning import Pruning
from hypersack.orchestrator.state import CoreState, Decision
from hypersack.policies.base import (
    ClusterView,
    Item,
    Need,
    Placement,
    Policy,
    compute_capacity,
    default_value,
    run_time_and_speed,
)
from hypersack.policies.columns import FitBounds, fits_empty
from hypersack.policies.plans import PlanError, check_plan
from hypersack.policies.predict import PredictPolicy
from hypersack.policies.registry import make_policy
from hypersack.sampler.profiles import demand_with_override

log = logging.getLogger(__name__)

MAX_RESERVED = 32  # GPUs one study may have reserved for its waiting trials at once


class Decider:
    def __init__(self, s: CoreState, book: Book, pruning: Pruning, profiling: Profiling) -> None:
        self.s = s
        self.book = book
        self.pruning = pruning
        self.profiling = profiling
        self.rules = RuleChooser(s)  # the rule of each study under `predict`

    def decide_all(self, active: list[StudyRecord], open_nodes: list[Node],
                   archs: frozenset[str]) -> tuple[list[Command], CycleState]:
        """Decide for every active study, in the order `shares` gives: priorities first,
        then each study up to its fair share, most under-served first, then what is left
        (reserving GPUs for large trials that found no room). The cycle's state is for
        the phases after (preemption)."""
        commands: list[Command] = []
        if not any(self.book.has_pending(s.id) for s in active):
            # Nothing waits: no decision, reservation or preemption to make. Most cycles
            # at a thousand nodes follow exits with nothing pending.
            return commands, CycleState([], {})
        claims, quotas = self.claims(active)
        cycle = CycleState(claims, quotas)
        capacity = float(self.s.cluster.open_gpus())  # open_nodes' GPUs, counted once
        above = 0.0  # what studies of higher priority hold
        reserved = cycle.reserved

        def decide(c: shares.Claim, room: float | None) -> bool:
            return self.decide_guarded(c, open_nodes, archs, room, cycle, commands)

        for level in shares.levels(claims):
            fair = shares.targets(level, capacity - above, self.user_weight)
            order = shares.deficit_order(level, fair)
            # First each study up to its share; then, for those its share cut short,
            # whatever is left (a study stopped by capacity would find nothing more).
            again: list[shares.Claim] = []
            for c in order:
                if not c.pending:
                    continue
                if len(level) == 1:  # its share is all the level has
                    decide(c, None)
                    if len(claims) > 1:  # others to reserve from
                        self.reserve(c, math.inf, open_nodes, reserved)
                    continue
                room = fair.get(c.study_id, 0.0) - c.used
                if room <= shares.EPS or decide(c, room):
                    again.append(c)
                else:
                    self.reserve(c, fair.get(c.study_id, 0.0) - c.used, open_nodes, reserved)
            for c in again:
                if c.pending:
                    decide(c, None)
            above += sum(c.used for c in level)
        return commands, cycle

    def reserve(self, claim: shares.Claim, budget: float, open_nodes: list[Node],
                 reserved: dict[tuple[str, int], str]) -> None:
        """Reserve, for each of the study's trials that found no room (largest first, up
        to `budget` GPU-equivalents), the unreserved GPU closest to fitting it."""
        ratios = self.s.spaces[claim.study_id].settings.oversubscription
        open_nodes = self.s.nodes_for(claim.study_id, open_nodes)
        for item in sorted(claim.unfit, key=lambda it: (-it.value, it.id))[:MAX_RESERVED]:
            if budget <= shares.EPS:
                return
            best: tuple[float, tuple[str, int], str] | None = None
            for node in open_nodes:
                for idx, gpu in node.gpus.items():
                    need = item.needs.get(gpu.arch)
                    units = self.gpu_units(gpu.arch)
                    if need is None or (node.name, idx) in reserved or units <= 0 or \
                            self.s.cluster.shortfalls(node, gpu, need, compute_capacity(
                                self.s.config.ratio(gpu.arch, ratios)), empty=True):
                        continue  # it could never fit there, or a profile job holds it
                    free = (units - gpu.used_compute) / units \
                        + (gpu.memory_mib - gpu.used_memory) / max(1, gpu.memory_mib)
                    if best is None or free > best[0]:
                        best = (free, (node.name, idx), gpu.arch)
            if best is None:
                return
            _, where, arch = best
            reserved[where] = claim.study_id
            budget -= self.cost(item.needs[arch].compute, arch)

    def user_weight(self, user: str) -> float:
        return self.s.config.share_rule(user).weight

    def gpu_units(self, arch: str) -> int:
        """One GPU's scaled compute at the server's ratio: the unit of shares."""
        return compute_capacity(self.s.config.ratio(arch, {}))

    def cost(self, compute: int, arch: str) -> float:
        """What holding `compute` units on a GPU of `arch` counts in a share."""
        return shares.share_of(compute, self.gpu_units(arch))

    def claims(self, active: list[StudyRecord]
                ) -> tuple[list[shares.Claim], dict[str, shares.Quota]]:
        """Each active study's standing (what it holds, whether it waits) and each of
        their users' quota left."""
        claims: dict[str, shares.Claim] = {}
        rule = self.s.config.share_rule(active[0].owner)
        if len(active) == 1 and rule.max_gpus is None and rule.max_compute is None:
            # Alone and without a quota: what it holds changes nothing (its decision
            # finds out whether anything waits).
            s = active[0]
            settings = self.s.spaces[s.id].settings
            return ([shares.Claim(s.id, s.owner, settings.priority, settings.weight, s.seq,
                                  pending=True)],
                    {s.owner: shares.Quota()})
        for s in active:
            settings = self.s.spaces[s.id].settings
            claims[s.id] = shares.Claim(s.id, s.owner, settings.priority, settings.weight,
                                        s.seq)
        used: dict[str, float] = {}
        held: dict[str, set[tuple[str, int]]] = {}
        for node in self.s.cluster:
            for idx, gpu in node.gpus.items():
                for tid in gpu.trials:
                    t = self.s.trials[tid]
                    c = claims.get(t.study_id)
                    if c is None or t.demand is None:
                        continue
                    cost = self.cost(Need.of(t.demand).compute, gpu.arch)
                    c.used += cost
                    used[c.user] = used.get(c.user, 0.0) + cost
                    held.setdefault(c.user, set()).add((node.name, idx))
        for c in claims.values():
            c.pending = self.book.has_pending(c.study_id)
        quotas = {u: shares.quota_left(self.s.config.share_rule(u), used.get(u, 0.0),
                                       held.get(u, set()))
                  for u in {c.user for c in claims.values()}}
        return list(claims.values()), quotas

    def decide_guarded(self, claim: shares.Claim, open_nodes: list[Node],
                        archs: frozenset[str], room: float | None, cycle: CycleState,
                        commands: list[Command]) -> bool:
        """One study's decision; one study's failed decision is undone (in memory, in the
        store and in the cycle) and leaves the others to theirs. True when its share
        (`room`) stopped it short."""
        closed = cycle.closed_to(claim.study_id)
        try:
            with cycle.attempt(claim) as (mine, quota), self.s.undone_if_raises():
                out, cut = self.decide(mine, open_nodes, archs, room, quota, closed)
        except Exception as exc:
            if self.s.store.failed(exc):
                raise
            self.s.decide_again = True
            if isinstance(exc, PlanError):  # a policy's bug (a plug-in's, say), not ours
                log.error("policy %r returned a plan for study %s that breaks an invariant "
                          "(%s); nothing of it was launched, and the decision is tried "
                          "again at the next event",
                          self.policy(self.s.spaces[claim.study_id], claim.study_id).name,
                          claim.study_id,
                          exc)
            else:
                log.exception("the decision for study %s failed and was undone; it is "
                              "tried again at the next event", claim.study_id)
            return False
        commands += out
        return cut

    def decide(self, claim: shares.Claim, open_nodes: list[Node], archs: frozenset[str],
                room: float | None, quota: shares.Quota, closed: set[tuple[str, int]]
                ) -> tuple[list[Command], bool]:
        """One policy run for one study's pending trials (and, where fused groups did not
        fit, further runs for their halves on what is left). Placements past the study's
        share (`room`, GPU-equivalents; None: no bound) or its user's quota wait. Returns
        the launches and whether the share stopped them short. `closed`: GPUs reserved
        for other studies, where it places nothing."""
        if not self.book.has_pending(claim.study_id):
            claim.pending = False  # before the view: at a thousand nodes it costs ms
            return [], False
        space = self.s.spaces[claim.study_id]
        policy = self.policy(space, claim.study_id)  # predict: its simulations start here
        if self.rules.holding(claim.study_id):
            return [], False  # its trials wait for its choice (orchestrator/foresight.py)
        open_nodes = self.s.nodes_for(claim.study_id, open_nodes)
        view = _closed(self.s.cluster.view(open_nodes, space.settings.oversubscription), closed)
        fused: dict[str, _Fused] = {}
        # In the study's order, read only as far as plain_items needs (with 20,000
        # pending, building them all was a third of the server's time per exit).
        alone: Iterable[TrialRecord] = self.book.pending_in_order(claim.study_id)
        if self.s.fusion_on(space):
            fused, alone = self.fused_items(space, list(alone), archs, view)
        batch = [f.item for f in fused.values()] + self.plain_items(
            claim.study_id, alone, archs, view)
        commands: list[Command] = []
        cut = False
        unfit: list[Item] = []
        while batch:
            plan = policy.place(batch, view)
            check_plan(batch, view, plan)  # no plan over a capacity is ever launched
            self.s.decisions.append(Decision(self.s.clock.now(), claim.study_id, policy.name,
                                           len(batch), len(plan.placements),
                                           plan.solve_time_s, plan, view, tuple(batch)))
            by_id = {it.id: it for it in batch}
            taken: list[Placement] = []
            for p in plan.placements:
                gpu = self.s.cluster.live(p.node).gpus[p.gpu_index]
                cost = self.cost(by_id[p.item_id].needs[gpu.arch].compute, gpu.arch)
                if room is not None and room <= shares.EPS:
                    cut = True
                    continue
                if not quota.allows((p.node, p.gpu_index), cost):
                    continue
                quota.take((p.node, p.gpu_index), cost)
                claim.used += cost
                if room is not None:
                    room -= cost
                taken.append(p)
                f = fused.get(p.item_id)
                if f is None:
                    commands.append(self.launch(self.s.trials[p.item_id], p.node, p.gpu_index))
                else:
                    commands.append(self.launch_group(f.members, p.node, p.gpu_index))
            unfit = [by_id[i] for i in plan.unplaced]
            if len(taken) < len(plan.placements):
                break  # the share or the quota is spent: nothing narrower either
            # A fused group that did not fit is cut into narrower groups (down to trials
            # alone) for what is left: a wide group where memory allows, co-location for
            # the rest.
            split = [fused.pop(i) for i in plan.unplaced if i in fused]
            if split:
                view = view.after(batch, plan)
            batch = []
            for f in split:
                narrower = [w for w in f.widths if w < len(f.members)]
                for chunk in fusion.chunks(f.members, narrower):
                    if len(chunk) == 1:
                        batch += self.plain_items(claim.study_id, chunk, archs, view)
                    else:
                        g = _Fused(chunk, f.widths, f.run_times, f.single_value)
                        fused[g.item.id] = g
                        batch.append(g.item)
        claim.pending = self.book.has_pending(claim.study_id)
        # Waiting for room: what is pending did not fit now but fits an empty GPU.
        claim.unfit = [it for it in unfit if fits_empty(it, view)] \
            if claim.pending and not cut else []
        return commands, cut

    def plain_items(self, study_id: str, trials: Iterable[TrialRecord],
                     archs: frozenset[str], view: ClusterView) -> list[Item]:
        """Trials alone. Trials with equal needs are interchangeable: once one fails to
        fit, so do the rest. Each group passes only as many as could fit in the free
        compute, plus one, so a decision costs what is placeable, not what is pending;
        the scan stops once every group the study may have waiting has passed its
        share (with 10,000 pending, most decisions look at a few dozen)."""
        batch: list[Item] = []
        # Exact counts of the study's pending trials per group: a group is done once it
        # passed its share or its last pending trial was seen.
        waiting = self.s.pending_groups.get(study_id)
        open_groups = len(waiting) if waiting is not None else -1
        fits = FitBounds(view)
        groups: dict[tuple[int, int | None, float], _Scan] = {}
        for t in trials:
            group = self.book.group(t)
            g = groups.get(group)
            if g is None:
                needs = self.profiling.needs(t, archs)
                epochs = self.book.segment(t)
                run_time, speed = run_time_and_speed(
                    {a: self.s.profiles[t.key, a].run_time_s(epochs) for a in needs})
                unseen = waiting.get(group, 0) if waiting is not None else 0
                g = groups[group] = _Scan(fits.bound(needs) if needs else 0, unseen,
                                          needs, run_time, speed, counted=unseen > 0)
            if g.left > 0:
                batch.append(Item(t.id, g.needs, g.run_time, speed=g.speed))
                g.left -= 1
            g.unseen -= 1
            if g.counted and (g.left <= 0 or g.unseen <= 0):
                g.counted = False
                open_groups -= 1  # its share passed, or none of it is left to see
            if open_groups == 0:
                break
        return batch

    def fused_items(self, space: SearchSpace, pending: list[TrialRecord],
                     archs: frozenset[str], view: ClusterView
                     ) -> tuple[dict[str, _Fused], list[TrialRecord]]:
        """Pending trials cut into fused groups of the widest measured width that is
        worth it (see `fusion`); the rest stay alone."""
        # With a pruner, a group's members are one rung's: they resume from the same
        # epoch and stop at the same next rung (Pack: packed members' budgets aligned).
        classes: dict[tuple[fusion.FusionClass, float, float], list[TrialRecord]] = {}
        alone: list[TrialRecord] = []
        for t in pending:
            c = fusion.class_of(t)
            if c is None:
                alone.append(t)
            else:
                classes.setdefault((c, t.done_epochs, self.book.segment(t)), []).append(t)
        gpus: dict[str, tuple[float, int]] = {}  # arch -> scaled capacity %, memory MiB
        for node in view.nodes:
            for g in node.gpus:
                cap = self.s.config.ratio(g.arch, space.settings.oversubscription) * 100.0
                gpus[g.arch] = (cap, max(g.full_memory, gpus.get(g.arch, (0.0, 0))[1]))
        fused: dict[str, _Fused] = {}
        fits = FitBounds(view)
        for ((key, _, _), _, segment), members in classes.items():
            widths: dict[int, dict[str, Need]] = {}
            run_times: dict[int, dict[str, float]] = {}
            for w in fusion.candidate_widths(space.settings.max_fusion_width, len(members)):
                needs = {}
                for arch in sorted(archs & gpus.keys()):
                    single = self.s.profiles.get((key, arch))
                    wide = self.s.profiles.get((fusion.fused_key(key, w), arch))
                    if single is not None and wide is not None and \
                            fusion.useful(single, wide, *gpus[arch]):
                        needs[arch] = Need.of(wide.demand)
                        run_times.setdefault(w, {})[arch] = wide.run_time_s(segment)
                if needs:
                    widths[w] = needs
            if not widths:
                alone += members
                continue
            # Only as many as could fit, widest first, plus one group.
            widest = max(widths)
            limit = min(len(members), fits.bound(widths[widest]) * widest)
            for chunk in fusion.chunks(members[:limit], list(widths)):
                if len(chunk) == 1:
                    alone.append(chunk[0])
                else:
                    f = _Fused(chunk, widths, run_times,
                               default_value(self.profiling.needs(members[0], archs)))
                    fused[f.item.id] = f
        return fused, alone

    def launch(self, t: TrialRecord, node_name: str, gpu_index: int,
                demand: Demand | None = None, group: str = "", width: int = 0
                ) -> LaunchTrial:
        """A trial's next attempt on that GPU, holding its profile's demand (a member of
        a fused group: its share of the group's, given)."""
        node = self.s.cluster.live(node_name)
        gpu = node.gpus[gpu_index]
        if demand is None:
            demand = demand_with_override(self.s.profiles[t.key, gpu.arch],
                                          t.memory_override_mib)
        stop_at = None
        if self.s.spaces[t.study_id].pause_mode():
            stop_at = rungs.next_rung(self.book.ladder(t), t.done_epochs)
        t = self.book.set(t, state=TrialState.RUNNING, node=node_name, gpu_index=gpu_index,
                      launched_on=node_name, demand=demand, launches=t.launches + 1,
                      started_at=t.started_at if t.done_epochs else self.s.clock.now(),
                      group=group, group_width=width, stop_at=stop_at)
        self.s.cluster.allocate(t.id, node, gpu, demand)
        return LaunchTrial(trial_id=t.id, study_id=t.study_id, node=node_name,
                           gpu_index=gpu_index, params=dict(t.params), key=t.key,
                           demand=demand, epochs=t.epochs, attempt=t.launches,
                           stop_at=stop_at or 0.0, done_epochs=t.done_epochs,
                           program=self.s.spaces[t.study_id].program,
                           owner=self.s.studies[t.study_id].owner)

    def launch_group(self, members: list[TrialRecord], node_name: str, gpu_index: int
                      ) -> LaunchGroup:
        """One process for a fused group; each member holds its share of the group's
        demand and runs (and ends) as its own trial."""
        gpu = self.s.cluster.live(node_name).gpus[gpu_index]
        width = len(members)
        key = fusion.fused_key(members[0].key, width)
        demand = self.s.profiles[key, gpu.arch].demand
        share = fusion.member_share(demand, width)
        group_id = f"{members[0].id}.k{width}.a{members[0].launches + 1}"
        launches = [self.launch(t, node_name, gpu_index, share, group_id, width)
                    for t in members]
        self.s.groups[group_id] = tuple(t.id for t in members)
        return LaunchGroup(group_id=group_id, node=node_name, gpu_index=gpu_index, key=key,
                           demand=demand, members=tuple(launches))

    def policy(self, space: SearchSpace, study_id: str | None = None) -> Policy:
        """The policy that places the study's trials: the server's, else the study's own;
        where that offers candidate rules (`predict`), the one chosen for the study
        (orchestrator/foresight.py)."""
        policy = self._made(self.s.config.policy or space.settings.policy)
        if study_id is None or not isinstance(policy, PredictPolicy):
            return policy
        ask = Ask(policy.candidates, policy.fallback, policy.max_trials, policy.max_gpus)
        return self._made(self.rules.rule(study_id, space, ask))

    def expect(self, space: SearchSpace) -> None:
        """A study arrives: where its decisions will ask `predict`'s simulations of a
        pool, the pool's process starts now, to be ready by its first decision."""
        if (self.s.config.policy or space.settings.policy) == PredictPolicy.name:
            self.rules.expect(space)

    def _made(self, name: str) -> Policy:
        if name not in self.s.policies:
            self.s.policies[name] = make_policy(name, **self.s.config.policy_options.get(name, {}))
        return self.s.policies[name]


@dataclass
class _Scan:
    """One workload group in a scan of pending trials (`_plain_items`)."""

    left: int  # how many more it may pass
    unseen: int  # how many of its pending trials the scan has yet to meet
    needs: dict[str, Need]
    run_time: float
    speed: dict[str, float]
    counted: bool  # still among the groups the scan waits for


@dataclass
class _Fused:
    """Pending trials that may go out as one fused group, and the widths their class
    may use (width -> needs per architecture, expected run time)."""

    members: list[TrialRecord]
    widths: dict[int, dict[str, Need]]
    run_times: dict[int, dict[str, float]]  # width -> expected run time per architecture
    single_value: int  # one member's value alone: the group's is its members' work

    @property
    def item(self) -> Item:
        w = len(self.members)
        # Its speed per architecture, as a trial alone has (`plain_items`): a fused
        # group runs faster on an H100 too, and the policies that weigh where an item
        # runs fastest must see it.
        run_time, speed = run_time_and_speed(self.run_times[w])
        return Item(f"fused:{self.members[0].id}", self.widths[w], run_time,
                    value=self.single_value * w, speed=speed)


def _closed(view: ClusterView, closed: set[tuple[str, int]]) -> ClusterView:
    """The view with these GPUs taking nothing new."""
    if not closed:
        return view
    return ClusterView(nodes=tuple(
        replace(n, gpus=tuple(replace(g, slots=0) if (n.name, g.index) in closed else g
                              for g in n.gpus))
        for n in view.nodes))
