"""Profiles: what the history knows of each workload on each architecture, what to
profile next and where, and the feedback of what running trials show."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from hypersack.core.errors import NotFound, StaleEvent
from hypersack.core.types import (
    Profile,
    StudyRecord,
    StudyState,
    TrialRecord,
    TrialState,
    WorkloadKey,
)
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator import fusion
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.cluster import Gpu, Node
from hypersack.orchestrator.commands import (
    Command,
    ProfileWorkload,
)
from hypersack.orchestrator.events import (
    ProfileFailed,
    ProfileMeasured,
    ProfilesForgotten,
    ProfilesImported,
    RunningTrial,
)
from hypersack.orchestrator.pruning import Pruning
from hypersack.orchestrator.state import CoreState, short
from hypersack.policies.base import (
    Need,
)
from hypersack.sampler import planning
from hypersack.sampler.feedback import corrected
from hypersack.sampler.planning import Slot
from hypersack.sampler.profiles import demand_with_override, to_import

log = logging.getLogger(__name__)


def params_text(params: dict[str, object], limit: int = 300) -> str:
    """A trial's parameters in one short line, for a reason."""
    return short(", ".join(f"{k}={v}" for k, v in sorted(params.items())), limit)


class Profiling:
    def __init__(self, s: CoreState, book: Book, pruning: Pruning) -> None:
        self.s = s
        self.book = book
        self.pruning = pruning
        book.on_release.append(self._released)

    def _released(self, t: TrialRecord) -> None:
        """What a trial was seen using while it ran is fed back to its profile."""
        seen = self.s.observed.pop(t.id, None)
        if seen is not None:
            self.feedback(t.key, seen[0], seen[1], seen[2], t.id, count=True)

    def needs(self, t: TrialRecord, archs: frozenset[str]) -> dict[str, Need]:
        ck = (t.key, t.memory_override_mib, archs)
        needs = self.s.needs_cache.get(ck)
        if needs is None:
            needs = {}
            for arch in sorted(archs):
                p = self.s.profiles.get((t.key, arch))
                if p is not None:
                    needs[arch] = Need.of(demand_with_override(p, t.memory_override_mib))
            self.s.needs_cache[ck] = needs
        return needs

    def observe(self, t: TrialRecord, gpu: Gpu, r: RunningTrial) -> None:
        """Keep a running trial's observed peaks; correct its profile when they exceed it."""
        if r.peak_memory_mib <= 0 and r.peak_utilization_pct <= 0:
            return
        before = self.s.observed.get(t.id)
        _, memory, util = before or (gpu.arch, 0, 0.0)
        peaks = (gpu.arch, max(memory, r.peak_memory_mib), max(util, r.peak_utilization_pct))
        if peaks != before:
            self.s.observed[t.id] = peaks
            self.feedback(t.key, *peaks, t.id)

    def feedback(self, key: WorkloadKey, arch: str, memory_mib: int, util_pct: float,
                  trial_id: str, *, count: bool = False, oom_at: int | None = None) -> None:
        """Record a trial's observed peaks in its profile (see `sampler.feedback`)."""
        p = self.s.profiles.get((key, arch))
        if p is None:
            return
        new = corrected(p, memory_mib, util_pct, trial_id, count=count, oom_at=oom_at,
                        margin=self.s.config.feedback_margin,
                        tolerance=self.s.config.feedback_compute_tolerance)
        if new is None:
            return
        self.s.profiles[key, arch] = new
        self.s.store.put_profile(new)
        if new.demand != p.demand:
            self.s.needs_cache.clear()
            self.s.profiling_dirty = True  # a fused width's memory guess may change

    def _given(self, slot: Slot, node: str, what: str, sample: str = "") -> None:
        """A node's profile result counts only for the profile job given to that node:
        any other is refused (and logged with the node's name), so that no node can
        write the cluster's history of a workload. A result that names the trial its job
        ran (`sample`) counts only for the job of that trial: after a failure the
        profile is given again with another trial's parameters, often to the same node,
        and a copy of the first failure sent again (not yet acknowledged) would
        otherwise fail the second trial with the first one's reason."""
        if not self.s.cluster.profile_jobs.running_on(node, slot):
            log.warning("node %s sent a profile %s for %s on %s, a job it was not given: "
                        "refused", short(node, 80), what, slot[0].label(), slot[1])
            raise StaleEvent(f"node {short(node, 80)} was given no profile job for "
                             f"{slot[0].label()} on {slot[1]}")
        current = self.s.profile_sample.get(slot)
        if sample and current is not None and sample != current:
            raise StaleEvent(f"the profile {what} for {slot[0].label()} on {slot[1]} is of "
                             f"the job with {short(sample, 80)}'s parameters, which ended; "
                             f"{short(node, 80)} now runs it with {current}'s",
                             expected=True)

    def on_profile(self, event: ProfileMeasured) -> list[Command]:
        profile = event.profile
        slot = (profile.key, profile.arch)
        if self.s.profiles.get(slot) == profile and \
                not self.s.cluster.profile_jobs.running_on(event.node, slot):
            # The result already taken, sent again: an agent sends a report again until
            # the server acknowledges it, and the batch that took it (its first decision
            # may simulate a large study for seconds) can outlast the agent's wait. It
            # changes nothing, and is no forged result to warn of.
            return []
        self._given(slot, event.node, "result", event.sample)
        self.s.cluster.profile_jobs.end(slot)
        self.s.profiles[slot] = profile
        self.s.forget_profile_failure(slot)
        self.s.profile_sample.pop(slot, None)
        self.s.needs_cache.clear()
        self.s.store.put_profile(profile)
        return self.s.decide()

    def on_imported(self, event: ProfilesImported) -> list[Command]:
        for p in to_import(event.profiles, self.s.profiles, event.replace):
            self.s.profiles[p.key, p.arch] = p
            self.s.forget_profile_failure((p.key, p.arch))
            self.s.store.put_profile(p)
        self.s.needs_cache.clear()
        return self.s.decide()

    def known_slots(self, model: str, arch: str = "") -> list[Slot]:
        """What the history holds of a workload (profiles and failures), for forgetting."""
        return sorted((s for s in {*self.s.profiles, *self.s.profile_failed}
                       if s[0].model == model and (not arch or s[1] == arch)),
                      key=lambda s: (s[0].label(), s[1]))

    def on_forgotten(self, event: ProfilesForgotten) -> list[Command]:
        """Forget what the history knows of a workload: its next study profiles it."""
        slots = self.known_slots(event.model, event.arch)
        if not slots:
            raise NotFound(f"the history has nothing of workload {short(event.model, 80)!r}"
                           + (f" on {short(event.arch, 40)}" if event.arch else ""))
        for slot in slots:
            if self.s.profiles.pop(slot, None) is not None:
                self.s.store.remove_profile(*slot)
            self.s.forget_profile_failure(slot)
        log.info("forgot %d profile(s) of %s", len(slots), event.model)
        return self.s.decide()

    def on_profile_failed(self, event: ProfileFailed) -> list[Command]:
        """A profile run failed. It ran one waiting trial's parameters, which may be what
        crashed: that trial fails with this reason as its own, and the profile is tried
        on another waiting trial's, up to `profile_samples` trials, before the workload
        counts as failed on this architecture (and its trials fail, saying so). A fused
        width's failure only stops fusing at that width."""
        slot = (event.key, event.arch)
        self._given(slot, event.node, "failure", event.sample)
        self.s.cluster.profile_jobs.end(slot)
        log.warning("profiling %s on %s failed: %s", event.key.label(), event.arch,
                    short(event.reason, 500))
        sample = self.s.trials.get(self.s.profile_sample.pop(slot, ""))
        if event.key.fusion_width != 1 or sample is None:
            self.s.profile_failed[slot] = event.reason
            return self.s.decide()
        tried = (*self.s.profile_tried.get(slot, ()), sample.id)
        if not sample.state.terminal:
            self.book.fail(sample, f"its profile run on {event.arch} failed with its "
                           f"parameters ({params_text(sample.params)}): {event.reason}")
            self.pruning.maybe_done(sample.study_id)
        others = any(t.key == event.key and t.id not in tried for t in self.waiting_trials())
        if len(tried) >= self.s.config.profile_samples or not others:
            self.s.profile_failed[slot] = (
                f"the profile run failed with the parameters of each of the {len(tried)} "
                f"trials tried ({', '.join(tried)}); the last: {event.reason}")
            self.s.profile_tried.pop(slot, None)
        else:
            self.s.profile_tried[slot] = tried
            self.s.profiling_dirty = True
        return self.s.decide()

    def waiting_trials(self) -> Iterator[TrialRecord]:
        """The trials of active studies that wait for a profile or a GPU."""
        for study in self.s.studies.values():
            if study.state != StudyState.ACTIVE:
                continue
            for tid in self.s.by_study[study.id]:
                t = self.s.trials[tid]
                if t.state in (TrialState.PENDING, TrialState.PROFILING):
                    yield t

    def state_demands(self, active: list[StudyRecord], archs: frozenset[str]) -> None:
        """A study that states its demand (`settings.demand`) needs no profile run: its
        workloads get profiles from it, on every architecture it names (or all). Written
        to the history like a measurement, with its source; a measured profile gives way,
        another study's stated one does not."""
        for study in active:
            settings = self.s.spaces[study.id].settings
            if settings.demand is None:
                continue
            keys = {self.s.trials[tid].key for tid in self.s.by_study[study.id]}
            for arch in sorted(archs):
                d = settings.stated_on(arch)
                if d is None:
                    continue
                for key in keys:
                    old = self.s.profiles.get((key, arch))
                    if old is not None and old.source.startswith("stated"):
                        continue
                    p = Profile(key=key, arch=arch, demand=d.demand(),
                                iter_time_s=d.epoch_s, iters_per_epoch=1,
                                source=f"stated by study {study.id}")
                    self.s.profiles[key, arch] = p
                    self.s.forget_profile_failure((key, arch))
                    self.s.store.put_profile(p)
                    self.s.needs_cache.clear()  # it may hold "no profile yet" for the key

    def fused_profiles_wanted(self, active: list[StudyRecord], open_nodes: list[Node],
                               archs: frozenset[str]) -> list[Slot]:
        """The fused widths to measure next: per workload and architecture with a profile
        alone, the narrowest width not yet measured (2, 4, 8, ... up to the study's limit
        and its pending trials of that workload), one at a time, and none past a width
        that failed or that the memory fit so far (a + b*K) says no GPU holds."""
        largest: dict[str, int] = {}
        out: list[Slot] = []
        for study in active:
            space = self.s.spaces[study.id]
            if not self.s.fusion_on(space):
                continue
            if not largest:  # walked only where a study may fuse (each join asks)
                for node in open_nodes:
                    for g in node.gpus.values():
                        largest[g.arch] = max(largest.get(g.arch, 0), g.memory_mib)
            counts: dict[WorkloadKey, int] = {}
            for t in self.book.pending_of(study.id):
                if fusion.class_of(t) is not None:
                    counts[t.key] = counts.get(t.key, 0) + 1
            for key, n in counts.items():
                widths = fusion.candidate_widths(space.settings.max_fusion_width, n)
                for arch in sorted(archs):
                    if (key, arch) not in self.s.profiles:
                        continue
                    for w in widths:
                        slot = (fusion.fused_key(key, w), arch)
                        if slot in self.s.profiles:
                            continue
                        guess = fusion.predicted_memory_mib(self.s.profiles, key, arch, w)
                        if slot not in self.s.profile_failed and (
                                guess is None or guess <= largest.get(arch, 0)):
                            out.append(slot)
                        break
        return out

    def profile_missing(self, active: list[StudyRecord], open_nodes: list[Node],
                         archs: frozenset[str]) -> list[Command]:
        """Profile each (workload, architecture) the history lacks, on a GPU of that
        architecture (see `sampler.planning`); move trials between PENDING and PROFILING;
        fail those no architecture can run."""
        if not archs:
            return []
        self.state_demands(active, archs)
        in_flight = self.s.cluster.profile_jobs.in_flight()
        wanted: list[Slot] = []
        samples: dict[WorkloadKey, TrialRecord] = {}  # a waiting trial of each workload
        # Per workload (its small number): what it lacks is asked once, not per trial
        # (hashing a workload key per trial was most of a 50,000-trial submission's walk).
        statuses: dict[int, str] = {}
        for study in active:
            for tid in self.s.by_study[study.id]:
                t = self.s.trials[tid]
                if t.state not in (TrialState.PENDING, TrialState.PROFILING):
                    continue
                number = self.book.key_number(t)
                status = statuses.get(number)
                if status is None:
                    samples.setdefault(t.key, t)
                    for slot in planning.missing(t.key, archs, self.s.profiles,
                                                 self.s.profile_failed):
                        if slot not in in_flight and slot not in wanted:
                            wanted.append(slot)
                    status = statuses[number] = planning.status(
                        t.key, archs, self.s.profiles, self.s.profile_failed)
                if status == "known":
                    if t.state == TrialState.PROFILING:
                        self.book.set(t, state=TrialState.PENDING)
                elif status == "failed":
                    reasons = "; ".join(f"{a}: {self.s.profile_failed[t.key, a]}"
                                        for a in sorted(archs))
                    self.book.fail(t, f"profiling failed on every architecture ({reasons})")
                    self.pruning.maybe_done(t.study_id)
                elif t.state == TrialState.PENDING:
                    self.book.set(t, state=TrialState.PROFILING)
        wanted += [s for s in self.fused_profiles_wanted(active, open_nodes, archs)
                   if s not in in_flight and s not in wanted]
        owners = {n.name: n.spec for n in open_nodes}

        def allowed(slot: Slot, g: planning.GpuSlot) -> bool:
            """A profile job runs a trial of its sample's owner: only where they may run."""
            sample = samples.get(fusion.fused_key(slot[0], 1))
            return sample is None or owners[g.node].takes(self.s.studies[sample.study_id].owner)

        jobs = self.s.cluster.profile_jobs
        if not wanted and not jobs.any_reserved():
            # Nothing to plan (each node's join asks, and building every GPU's slot made
            # a thousand joins cost a million).
            self.s.profiling_waiting = False
            return []
        plan = planning.plan_profiles(wanted, jobs.slots(open_nodes), allowed)
        for slot, g in plan.reserve:
            node = self.s.cluster.live(g.node)
            jobs.reserve(node, node.gpus[g.index], slot)
        commands: list[Command] = []
        for slot, g in plan.start:
            node = self.s.cluster.live(g.node)
            jobs.start(node, node.gpus[g.index], slot)
            sample = samples[fusion.fused_key(slot[0], 1)]
            self.s.profile_sample[slot] = sample.id
            commands.append(ProfileWorkload(key=slot[0], arch=slot[1], node=node.name,
                                            gpu_index=g.index,
                                            iterations=self.s.config.profile_iterations,
                                            warmup=self.s.config.profile_warmup,
                                            params=dict(sample.params), epochs=sample.epochs,
                                            program=self.s.spaces[sample.study_id].program,
                                            owner=self.s.studies[sample.study_id].owner,
                                            sample=sample.id))
        # Run again at the next exit while a wanted profile found no GPU or a reserved
        # GPU has yet to drain.
        assigned = {slot for slot, _ in (*plan.start, *plan.reserve)}
        self.s.profiling_waiting = any(s not in assigned for s in wanted) or \
            jobs.any_reserved()
        return commands

    def fusion(self, space: SearchSpace) -> bool:
        return self.s.config.fusion and not self.s.config.exclusive and fusion.enabled(space)
