"""Nodes joining, leaving, draining and heartbeating: what each runs is reconciled
with what the core holds there."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from hypersack.core.cluster import near_miss
from hypersack.core.types import (
    NodeRecord,
    TrialRecord,
    TrialState,
)
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.cluster import Node
from hypersack.orchestrator.commands import (
    Command,
    KillTrial,
)
from hypersack.orchestrator.events import (
    Heartbeat,
    NodeDrained,
    NodeJoined,
    NodeLost,
    RunningTrial,
)
from hypersack.orchestrator.profiling import Profiling
from hypersack.orchestrator.state import CoreState
from hypersack.policies.base import Need, compute_capacity
from hypersack.sampler.profiles import demand_with_override

log = logging.getLogger(__name__)

# Kills of trials a node reports but was never given, at most, per report.
UNKNOWN_KILLS_PER_REPORT = 256


class Membership:
    def __init__(self, s: CoreState, book: Book, profiling: Profiling) -> None:
        self.s = s
        self.book = book
        self.profiling = profiling
        book.on_transition.append(self._heard)

    def _heard(self, old: TrialRecord, new: TrialRecord) -> None:
        """A trial that stops running is no longer missing from any heartbeat."""
        if old.state == TrialState.RUNNING and new.state != TrialState.RUNNING:
            self.s.missing.pop(old.id, None)

    def on_heartbeat(self, event: Heartbeat) -> list[Command]:
        node = self.s.cluster.live(event.node)
        self.s.cluster.seen(node, self.s.clock.now())
        return self.reconcile(node, event.running, joined=False)

    def on_lost(self, event: NodeLost) -> list[Command]:
        self.s.cluster.live(event.node)
        self.lose(event.node, event.reason)
        return self.s.decide()

    def on_drained(self, event: NodeDrained) -> list[Command]:
        node = self.s.cluster.live(event.node)
        self.s.cluster.set_draining(node, event.draining)
        self.s.store.put_node(node.record())
        return [] if event.draining else self.s.decide()

    def on_joined(self, event: NodeJoined) -> list[Command]:
        spec = event.node
        old = self.s.cluster.get(spec.name)
        now = self.s.clock.now()
        if old is not None and old.spec != spec:
            # Same name, new inventory (a GPU appeared or failed): keep what still runs.
            self.lose(spec.name, "re-registered with a different inventory")
            old = None
        if old is None:
            node = self.s.cluster.add(NodeRecord(spec=spec, draining=False), now)
            self.s.store.put_node(node.record())
            log.info("node %s joined: %d GPUs, %g cores", spec.name, len(spec.gpus), spec.cores)
            self._say_near_misses(node)
        else:
            node = old
            self.s.cluster.seen(node, now)
            self.replan_profiles(node)
        return self.reconcile(node, event.running, joined=True) + self.s.decide()

    def _say_near_misses(self, node: Node) -> None:
        """A configured ratio whose architecture is a near miss of this node's (`a100`,
        `A100-80GB` for A100) never applies to it: said once per join, as the node's
        GPUs take the default ratio instead."""
        ratios = self.s.config.oversubscription
        for arch in sorted(set(node.archs()) - set(ratios)):
            near = [k for k in ratios if near_miss(k, arch)]
            if near:
                log.warning("node %s has %s GPUs, and the configured ratios name %s, not "
                            "%s (architectures are matched exactly): they take the default "
                            "ratio %g", node.spec.name, arch, ", ".join(near), arch,
                            self.s.config.default_ratio)

    def replan_profiles(self, node: Node) -> None:
        """A node that (re)joins may never have got the profile jobs placed on it (its
        agent was not connected when they were sent), or may have lost them with a
        restart: they are planned again, and go to it (or elsewhere) anew. An agent
        still running one ignores the repeated job; a result from a node no longer
        holding the job is refused as stale."""
        for gpu in node.gpus.values():
            slot = gpu.profiling
            if slot is None:
                continue
            self.s.cluster.profile_jobs.end(slot)
            self.s.profiling_dirty = True
            log.info("node %s joined again: profiling %s on %s is planned again",
                     node.spec.name, slot[0].label(), slot[1])

    def reconcile(self, node: Node, running: Iterable[RunningTrial], *, joined: bool
                   ) -> list[Command]:
        """Adopt what the node runs for us, kill what it runs that we do not want, and
        requeue what it should run but does not: at once on (re)registration, after
        `missing_grace_s` of heartbeats that leave it out otherwise."""
        running = tuple(running)
        if not joined and node.quiet == (node.version, running):
            # The list the last heartbeat gave, and nothing changed on the node since (any
            # launch, exit, adoption or undo bumps its version): that reconciliation sent
            # nothing and found nothing missing, so this one would do the same. A
            # thousand nodes' heartbeats a second were a tenth of the server's core.
            return []
        node.quiet = None
        commands: list[Command] = []
        reported = {r.trial_id for r in running}
        unknown = 0
        # Locals for the loop: a thousand nodes list tens of thousands of trials a minute,
        # nearly all running where the server put them.
        trials, gpus, name, observe = self.s.trials, node.gpus, node.spec.name, \
            self.profiling.observe
        for r in running:
            t = trials.get(r.trial_id)
            gpu = gpus.get(r.gpu_index)
            # Running here, in its current attempt and not yet exited: only its peaks
            # are news (every other trial running here is an older attempt or a handled
            # exit, below).
            if t is not None and t.state == TrialState.RUNNING and t.node == name and (
                    not r.attempt or t.exited < r.attempt == t.launches):
                if gpu is not None and (r.peak_memory_mib > 0 or r.peak_utilization_pct > 0):
                    observe(t, gpu, r)  # its peaks (none reported: nothing to keep)
                continue
            if t is not None and r.attempt and r.attempt != t.launches:
                # An older attempt still runs (its node came back after it was lost and
                # the trial launched again): it goes, the current attempt stays.
                commands.append(KillTrial(r.trial_id, node.spec.name,
                                          f"attempt {r.attempt} was superseded by attempt "
                                          f"{t.launches}", attempt=r.attempt))
                continue
            if t is not None and r.attempt and r.attempt <= t.exited:
                continue  # its exit was handled: the agent lists it until acknowledged
            profile = None
            if (t is not None and gpu is not None
                    and t.state in (TrialState.PENDING, TrialState.PROFILING)
                    and t.launched_on == node.spec.name):
                # Only what this node was given, in its latest attempt: a node cannot
                # claim a trial it never ran.
                profile = self.s.profiles.get((t.key, gpu.arch))
            demand = None if t is None or profile is None else \
                demand_with_override(profile, t.memory_override_mib)
            if t is not None and gpu is not None and demand is not None and \
                    not self.s.cluster.shortfalls(node, gpu, Need.of(demand), compute_capacity(
                        self.s.config.ratio(gpu.arch,
                                            self.s.spaces[t.study_id].settings.oversubscription))):
                self.book.set(t, state=TrialState.RUNNING, node=node.spec.name,
                              gpu_index=gpu.spec_index, demand=demand)
                self.s.cluster.allocate(t.id, node, gpu, demand)
                log.info("adopted %s on %s:%d", t.id, node.spec.name, gpu.spec_index)
            elif demand is not None:
                # Its place was given to others meanwhile: it stops, and runs again.
                commands.append(KillTrial(r.trial_id, node.spec.name, "no room for it there "
                                          "any more", attempt=r.attempt))
            elif unknown < UNKNOWN_KILLS_PER_REPORT:
                # Bounded per report: a node listing many trials it was never given
                # (a rogue, or a stale work directory) cannot make the server queue a
                # kill for each; the rest are killed as later reports list them still.
                unknown += 1
                commands.append(KillTrial(r.trial_id, node.spec.name,
                                          "not scheduled here (duplicate or unknown)"))
            else:
                unknown += 1
        if unknown > UNKNOWN_KILLS_PER_REPORT:
            log.warning("node %s reports %d trials it was not given; killing %d of them now",
                        node.spec.name, unknown, UNKNOWN_KILLS_PER_REPORT)
        now = self.s.clock.now()
        requeued = False
        left_out = False  # a trial of ours it does not list: missing, or requeued now
        for tid in reported & self.s.missing.keys():
            del self.s.missing[tid]
        for gpu in node.gpus.values():
            for tid in sorted(gpu.trials - reported):
                left_out = True
                if not joined:
                    since = self.s.missing.setdefault(tid, now)
                    if now - since <= self.s.config.missing_grace_s:
                        continue
                self.book.release(tid)
                self.book.requeue(self.s.trials[tid], reason=f"not running on {node.spec.name}"
                              + ("" if joined else f" (left out of its heartbeats for "
                                 f"{now - since:.0f} s, and no exit came)"))
                log.info("%s is not running on %s; requeued", tid, node.spec.name)
                requeued = True
        if requeued and not joined:  # a join decides anyway
            commands += self.s.decide()
        if not commands and not left_out:
            node.quiet = (node.version, running)
        return commands

    def lose(self, name: str, reason: str) -> None:
        self.s.profiling_dirty = True  # its profile jobs and GPUs are gone
        node = self.s.cluster.remove(name)
        self.s.store.remove_node(name)
        for gpu in node.gpus.values():
            for tid in sorted(gpu.trials):
                t = self.s.trials[tid]
                self.s.groups.pop(t.group, None)
                self.book.requeue(t)
            gpu.trials = frozenset()
        log.warning("node %s lost (%s); its trials are pending again", name, reason)
