"""The orchestrator: a deterministic state machine over studies, trials, nodes and profiles.

`handle(event)` applies one event, persists every change through the injected Store in
one transaction, decides again where capacity or demand changed, and returns the
commands for the drivers to carry out. It reads time only from the injected clock.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hypersack.core.bounds import MAX_COMPUTE_PCT, MAX_MEMORY_MIB
from hypersack.core.clock import Clock
from hypersack.core.errors import HyperSackError, InvalidInput, NotFound, StaleEvent
from hypersack.core.types import (
    Demand,
    NodeRecord,
    NodeSpec,
    Profile,
    StudyRecord,
    StudyState,
    TrialRecord,
    TrialState,
    WorkloadKey,
)
from hypersack.grid.expand import expand
from hypersack.grid.space import SearchSpace, parse_space
from hypersack.grid.trial import check_transition
from hypersack.orchestrator.commands import Command, KillTrial, LaunchTrial, ProfileWorkload
from hypersack.orchestrator.events import (
    Event,
    Heartbeat,
    NodeDrained,
    NodeJoined,
    NodeLost,
    ProfileFailed,
    ProfileMeasured,
    ProfilesImported,
    RunningTrial,
    StudyCancelled,
    StudySubmitted,
    Tick,
    TrialFailed,
    TrialFinished,
    TrialOutOfMemory,
    TrialProgress,
    TrialStarted,
)
from hypersack.orchestrator.journal import Journal, journaled
from hypersack.policies.base import (
    ClusterView,
    GpuBin,
    Item,
    Need,
    NodeBin,
    Plan,
    Policy,
    check_plan,
    compute_capacity,
    core_units,
)
from hypersack.policies.registry import make_policy
from hypersack.sampler.profiles import demand_with_override, to_import
from hypersack.store.base import Store

log = logging.getLogger(__name__)

DEFAULT_RATIOS: dict[str, float] = {"A100": 3.0, "H100": 2.5}


@dataclass(frozen=True)
class OrchestratorConfig:
    """Server-wide settings; a study's own settings override the ratios and the policy."""

    oversubscription: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RATIOS))
    default_ratio: float = 1.0
    heartbeat_timeout_s: float = 30.0
    restore_grace_s: float = 30.0  # extra time for the nodes of a restarted server
    exclusive: bool = False  # one trial per GPU: the baseline the paper compares against
    oom_growth: float = 1.5  # memory demand factor after an out-of-memory death
    # Feedback: a profile's memory demand becomes a trial's observed peak plus this share
    # when the peak exceeds it; its compute demand becomes the observed utilization when
    # that exceeds the demand by more than the tolerance (utilization is noisy).
    feedback_margin: float = 0.05
    feedback_compute_tolerance: float = 0.25
    profile_iterations: int = 10
    profile_warmup: int = 1
    policy: str | None = None  # overrides every study's policy when set
    policy_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    decision_log: int = 1000  # how many recent decisions to keep for inspection

    def ratio(self, arch: str, study_ratios: Mapping[str, float]) -> float:
        if arch in study_ratios:
            return study_ratios[arch]
        return self.oversubscription.get(arch, self.default_ratio)


@dataclass
class _Gpu:
    spec_index: int
    arch: str
    memory_mib: int
    used_compute: int = 0
    used_memory: int = 0
    trials: set[str] = field(default_factory=set)
    profiling: tuple[WorkloadKey, str] | None = None
    reserved_for: tuple[WorkloadKey, str] | None = None


@dataclass
class _Node:
    spec: NodeSpec
    draining: bool
    last_seen: float
    used_cores: int = 0
    gpus: dict[int, _Gpu] = field(default_factory=dict)

    def save(self) -> tuple[Any, ...]:
        """What the journal keeps to undo changes made in place."""
        return (self.draining, self.last_seen, self.used_cores,
                {i: (g.used_compute, g.used_memory, set(g.trials), g.profiling, g.reserved_for)
                 for i, g in self.gpus.items()})

    def restore(self, saved: tuple[Any, ...]) -> None:
        self.draining, self.last_seen, self.used_cores, gpus = saved
        for i, (compute, memory, trials, profiling, reserved) in gpus.items():
            g = self.gpus[i]
            g.used_compute, g.used_memory, g.trials = compute, memory, set(trials)
            g.profiling, g.reserved_for = profiling, reserved

    @classmethod
    def of(cls, record: NodeRecord, now: float) -> _Node:
        node = cls(spec=record.spec, draining=record.draining, last_seen=now)
        for g in record.spec.gpus:
            node.gpus[g.index] = _Gpu(g.index, g.arch, g.memory_mib)
        return node


@dataclass(frozen=True)
class Decision:
    """One policy run, kept for inspection (`hypersack plan`, metrics, benchmarks)."""

    at: float
    study_id: str
    policy: str
    items: int
    placed: int
    solve_time_s: float
    plan: Plan
    view: ClusterView
    batch: tuple[Item, ...]


@dataclass
class BatchResult:
    """What a batch of events caused: the commands, the stale events (they contradict the
    current state and changed nothing) and the refused ones (their handling raised; they
    changed nothing either)."""

    commands: list[Command] = field(default_factory=list)
    stale: list[StaleEvent] = field(default_factory=list)
    refused: list[tuple[Event, Exception]] = field(default_factory=list)


class Orchestrator:
    def __init__(self, store: Store, clock: Clock, config: OrchestratorConfig | None = None
                 ) -> None:
        self._store = store
        self._clock = clock
        self.config = config or OrchestratorConfig()
        self._policies: dict[str, Policy] = {}
        # Every dictionary of state is journaled: a refused event changes none of them.
        j = self._journal = Journal()
        self._studies: dict[str, StudyRecord] = journaled(j)
        self._spaces: dict[str, SearchSpace] = journaled(j)
        self._trials: dict[str, TrialRecord] = journaled(j)
        self._by_study: dict[str, list[str]] = journaled(j)
        self._open: dict[str, int] = journaled(j)  # trials not yet terminal, per study
        self._nodes: dict[str, _Node] = journaled(j)
        self._profiles: dict[tuple[WorkloadKey, str], Profile] = journaled(j)
        self._profile_failed: dict[tuple[WorkloadKey, str], str] = journaled(j)
        # trial: arch, peak MiB, peak %
        self._observed: dict[str, tuple[str, int, float]] = journaled(j)
        self._needs_cache: dict[tuple[WorkloadKey, int | None, frozenset[str]],
                                dict[str, Need]] = {}
        self._dirty: set[str] = set()
        self._dirty_studies: set[str] = set()
        self.decisions: deque[Decision] = deque(maxlen=self.config.decision_log)
        self.decision_count = 0
        self.decision_time_s = 0.0
        self._deferred = False
        self._schedule_wanted = False
        self._restore()

    # ----------------------------------------------------------------- restore
    def _restore(self) -> None:
        """Rebuild from the store: a restarted server resumes every study where it was."""
        now = self._clock.now()
        for p in self._store.list_profiles():
            self._profiles[p.key, p.arch] = p
        # Restored nodes get a grace period: their agents need a moment to find the
        # restarted server before silence means they are gone.
        for rec in self._store.list_nodes():
            self._nodes[rec.spec.name] = _Node.of(rec, now + self.config.restore_grace_s)
        for study in self._store.list_studies():
            self._studies[study.id] = study
            self._spaces[study.id] = parse_space(study.space, source=f"study {study.id}")
            self._by_study[study.id] = []
            self._open[study.id] = 0
        for t in self._store.list_trials():
            self._trials[t.id] = t
            self._by_study.setdefault(t.study_id, []).append(t.id)
            self._open[t.study_id] = self._open.get(t.study_id, 0) + (not t.state.terminal)
            if t.state == TrialState.RUNNING:
                node = self._nodes.get(t.node or "")
                index = t.gpu_index if t.gpu_index is not None else -1
                gpu = node.gpus.get(index) if node else None
                if node is None or gpu is None or t.demand is None:
                    # Its node is gone from the inventory: run it again.
                    self._requeue(t)
                else:
                    self._allocate(t.id, node, gpu, t.demand)
        if self._dirty:
            with self._store.transaction():
                self._flush()
        log.info("restored %d studies, %d trials, %d nodes, %d profiles", len(self._studies),
                 len(self._trials), len(self._nodes), len(self._profiles))

    # ----------------------------------------------------------------- queries
    def studies(self) -> list[StudyRecord]:
        return sorted(self._studies.values(), key=lambda s: s.seq)

    def study(self, study_id: str) -> StudyRecord:
        try:
            return self._studies[study_id]
        except KeyError:
            raise NotFound(f"no study {study_id!r}") from None

    def space(self, study_id: str) -> SearchSpace:
        self.study(study_id)
        return self._spaces[study_id]

    def trials(self, study_id: str | None = None) -> list[TrialRecord]:
        if study_id is None:
            return [self._trials[t] for s in self.studies() for t in self._by_study[s.id]]
        self.study(study_id)
        return [self._trials[t] for t in self._by_study[study_id]]

    def trial(self, trial_id: str) -> TrialRecord:
        try:
            return self._trials[trial_id]
        except KeyError:
            raise NotFound(f"no trial {trial_id!r}") from None

    def has_node(self, name: str) -> bool:
        return name in self._nodes

    def nodes(self) -> list[NodeRecord]:
        return [NodeRecord(spec=n.spec, draining=n.draining) for n in self._nodes.values()]

    def profiles(self) -> list[Profile]:
        return list(self._profiles.values())

    def gpu_load(self) -> dict[tuple[str, int], tuple[int, float]]:
        """(node, GPU index) -> (trials running, scaled-compute share used, 0..1)."""
        out = {}
        for node in self._nodes.values():
            for idx, gpu in node.gpus.items():
                cap = compute_capacity(self.config.ratio(gpu.arch, {}))
                out[node.spec.name, idx] = (len(gpu.trials), gpu.used_compute / cap if cap else 0.0)
        return out

    # ----------------------------------------------------------------- events
    def handle(self, event: Event) -> list[Command]:
        """Apply one event; returns the commands it causes. Raises StaleEvent for an event
        that contradicts the current state, and whatever its handling raised for a refused
        one; nothing changes then, in memory or in the store."""
        result = self.handle_batch((event,))
        if result.stale:
            raise result.stale[0]
        if result.refused:
            raise result.refused[0][1]
        return result.commands

    def handle_batch(self, events: Iterable[Event]) -> BatchResult:
        """Apply several events, then decide once: under load one decision serves every
        exit that arrived meanwhile. Each event runs in a savepoint of the store and a mark
        of the journal: one whose handling raises is refused and undone, in memory and in
        the store, and the others go on. A decision that raises is undone the same way
        (the next event or tick decides again). If the store itself fails, the whole batch
        is undone and the error raised."""
        result = BatchResult()
        self._journal.begin()
        try:
            with self._store.transaction():
                self._deferred = True
                try:
                    for event in events:
                        self._guarded(event, result)
                finally:
                    self._deferred = False
                if self._schedule_wanted:
                    self._guarded(None, result)
                self._flush()
        except BaseException:
            self._journal.rollback_to(0)
            self._needs_cache.clear()
            self._dirty.clear()
            self._dirty_studies.clear()
            raise
        finally:
            self._journal.end()
        return result

    @contextmanager
    def _undone_if_raises(self) -> Iterator[None]:
        """Whatever the block changes, in memory and in the store, is undone if it raises
        (and the error raised on)."""
        mark = self._journal.mark()
        try:
            with self._store.savepoint():
                yield
        except BaseException:
            self._journal.rollback_to(mark)
            self._needs_cache.clear()  # it may hold needs of a profile that was undone
            raise

    def _guarded(self, event: Event | None, result: BatchResult) -> None:
        """Handle one event (None: decide), undoing all it did if it raises."""
        try:
            with self._undone_if_raises():
                commands = self._dispatch(event) if event is not None else self._schedule()
        except StaleEvent as exc:
            result.stale.append(exc)
        except Exception as exc:
            what = "a decision" if event is None else _short(repr(event))
            if isinstance(exc, HyperSackError):
                log.warning("refused %s: %s", what, exc)
            else:
                log.exception("refused %s: its handling failed; nothing changed", what)
            if event is not None:
                result.refused.append((event, exc))
        else:
            result.commands += commands

    def _dispatch(self, event: Event) -> list[Command]:
        if isinstance(event, TrialProgress):
            self._running_on(event.trial_id, event.node, event.attempt)
            return []
        if isinstance(event, Heartbeat):
            node = self._live(event.node)
            self._journal.touch(node)
            node.last_seen = self._clock.now()
            return self._reconcile(node, event.running, joined=False)
        if isinstance(event, TrialStarted):
            self._running_on(event.trial_id, event.node, event.attempt)
            return []
        if isinstance(event, TrialFinished):
            return self._on_finished(event)
        if isinstance(event, TrialFailed):
            return self._on_failed(event)
        if isinstance(event, TrialOutOfMemory):
            return self._on_oom(event)
        if isinstance(event, StudySubmitted):
            return self._on_submitted(event.space)
        if isinstance(event, StudyCancelled):
            return self._on_cancelled(event.study_id)
        if isinstance(event, NodeJoined):
            return self._on_joined(event)
        if isinstance(event, NodeLost):
            self._live(event.node)
            self._lose(event.node, event.reason)
            return self._schedule()
        if isinstance(event, NodeDrained):
            node = self._live(event.node)
            self._journal.touch(node)
            node.draining = True
            self._store.put_node(NodeRecord(spec=node.spec, draining=True))
            return []
        if isinstance(event, ProfileMeasured):
            return self._on_profile(event.profile)
        if isinstance(event, ProfileFailed):
            return self._on_profile_failed(event)
        if isinstance(event, ProfilesImported):
            return self._on_imported(event)
        if isinstance(event, Tick):
            now = self._clock.now()
            for name in [n for n, node in self._nodes.items()
                         if now - node.last_seen > self.config.heartbeat_timeout_s]:
                self._lose(name, f"no heartbeat for {self.config.heartbeat_timeout_s:g} s")
            return self._schedule()
        raise InvalidInput(f"unknown event {event!r}")

    def _live(self, name: str) -> _Node:
        node = self._nodes.get(name)
        if node is None:
            raise StaleEvent(f"node {name!r} is not registered")
        return node

    def _running_on(self, trial_id: str, node: str, attempt: int = 0, *,
                    exit: bool = False) -> TrialRecord:
        """The trial an event of `node` is about, if that node runs it in that attempt.
        An exit of the trial's latest attempt also counts while the trial waits to run
        again after a brief loss of its node: the work was done. Attempt 0: not said."""
        t = self._trials.get(trial_id)
        if t is None:
            raise StaleEvent(f"no trial {_short(trial_id, 80)!r}")
        if attempt and attempt != t.launches:
            raise StaleEvent(f"trial {trial_id}: attempt {attempt} was superseded by attempt "
                             f"{t.launches}")
        if exit and attempt and t.state == TrialState.PENDING:
            log.info("%s: the exit of attempt %d arrived after its node was lost; it counts",
                     trial_id, attempt)
            return t
        if t.state != TrialState.RUNNING or t.node != node:
            raise StaleEvent(f"trial {trial_id} is {t.state.value}"
                             + (f" on {t.node}" if t.node else "") + f", not running on {node}")
        return t

    def _on_submitted(self, space: SearchSpace) -> list[Command]:
        seq = max((s.seq for s in self._studies.values()), default=0) + 1
        study_id = f"{space.name}-{seq}"
        study = StudyRecord(id=study_id, name=space.name, space=space.model_dump(mode="json"),
                            submitted_at=self._clock.now(), seq=seq)
        trials = expand(space, study_id)
        self._store.add_study(study, trials)
        self._studies[study_id] = study
        self._spaces[study_id] = space
        self._by_study[study_id] = [t.id for t in trials]
        self._open[study_id] = len(trials)
        for t in trials:
            self._trials[t.id] = t
        log.info("study %s submitted: %d trials", study_id, len(trials))
        return self._schedule()

    def _on_cancelled(self, study_id: str) -> list[Command]:
        study = self.study(study_id)
        if study.state != StudyState.ACTIVE:
            return []
        commands: list[Command] = []
        for tid in self._by_study[study_id]:
            t = self._trials[tid]
            if t.state == TrialState.RUNNING:
                assert t.node is not None
                commands.append(KillTrial(t.id, t.node, "study cancelled", attempt=t.launches))
                self._release(t.id)
            if not t.state.terminal:
                self._set(t, state=TrialState.CANCELLED, reason="study cancelled",
                          finished_at=self._clock.now())
        self._set_study(study, StudyState.CANCELLED)
        return commands + self._schedule()

    def _on_joined(self, event: NodeJoined) -> list[Command]:
        spec = event.node
        old = self._nodes.get(spec.name)
        now = self._clock.now()
        if old is not None and old.spec != spec:
            # Same name, new inventory (a GPU appeared or failed): keep what still runs.
            self._lose(spec.name, "re-registered with a different inventory")
            old = None
        if old is None:
            draining = False
            node = _Node.of(NodeRecord(spec=spec, draining=draining), now)
            self._nodes[spec.name] = node
            self._store.put_node(NodeRecord(spec=spec, draining=draining))
            log.info("node %s joined: %d GPUs, %g cores", spec.name, len(spec.gpus), spec.cores)
        else:
            node = old
            self._journal.touch(node)
            node.last_seen = now
        return self._reconcile(node, event.running, joined=True) + self._schedule()

    def _reconcile(self, node: _Node, running: Iterable[RunningTrial], *, joined: bool
                   ) -> list[Command]:
        """Adopt what the node runs for us, kill what it runs that we do not want, and, on
        (re)registration, requeue what it should run but does not."""
        commands: list[Command] = []
        reported = set()
        for r in running:
            reported.add(r.trial_id)
            t = self._trials.get(r.trial_id)
            gpu = node.gpus.get(r.gpu_index)
            if t is not None and r.attempt and r.attempt != t.launches:
                # An older attempt still runs (its node came back after it was lost and
                # the trial launched again): it goes, the current attempt stays.
                commands.append(KillTrial(r.trial_id, node.spec.name,
                                          f"attempt {r.attempt} was superseded by attempt "
                                          f"{t.launches}", attempt=r.attempt))
                continue
            if t is not None and t.state == TrialState.RUNNING and t.node == node.spec.name:
                if gpu is not None:
                    self._observe(t, gpu, r)
                continue
            profile = None
            if t is not None and gpu is not None and t.state in (TrialState.PENDING,
                                                                 TrialState.PROFILING):
                profile = self._profiles.get((t.key, gpu.arch))
            if t is not None and gpu is not None and profile is not None:
                demand = demand_with_override(profile, t.memory_override_mib)
                self._set(t, state=TrialState.RUNNING, node=node.spec.name,
                          gpu_index=gpu.spec_index, demand=demand)
                self._allocate(t.id, node, gpu, demand)
                log.info("adopted %s on %s:%d", t.id, node.spec.name, gpu.spec_index)
            else:
                commands.append(KillTrial(r.trial_id, node.spec.name,
                                          "not scheduled here (duplicate or unknown)"))
        if joined:
            for gpu in node.gpus.values():
                for tid in sorted(gpu.trials - reported):
                    self._release(tid)
                    self._requeue(self._trials[tid])
                    log.info("%s did not survive on %s; requeued", tid, node.spec.name)
        return commands

    def _lose(self, name: str, reason: str) -> None:
        node = self._nodes[name]
        self._journal.touch(node)
        del self._nodes[name]
        self._store.remove_node(name)
        for gpu in node.gpus.values():
            for tid in sorted(gpu.trials):
                t = self._trials[tid]
                self._requeue(t)
            gpu.trials.clear()
        log.warning("node %s lost (%s); its trials are pending again", name, reason)

    def _on_finished(self, event: TrialFinished) -> list[Command]:
        t = self._running_on(event.trial_id, event.node, event.attempt, exit=True)
        self._release(t.id)
        objective = event.objective
        if objective is None:
            objective = event.metrics.get(self._spaces[t.study_id].settings.objective.metric)
        self._set(t, state=TrialState.COMPLETED, metrics=dict(event.metrics),
                  objective=objective, finished_at=self._clock.now(), reason="",
                  log_tail=event.log_tail[-4000:])
        self._maybe_done(t.study_id)
        return self._schedule()

    def _on_failed(self, event: TrialFailed) -> list[Command]:
        t = self._running_on(event.trial_id, event.node, event.attempt, exit=True)
        self._release(t.id)
        retries = self._spaces[t.study_id].settings.retries
        failures = t.failures + 1
        tail = event.log_tail[-4000:]
        if failures > retries:
            self._fail(t, f"exit code {event.exit_code}; failed {failures} times "
                          f"(retries: {retries})", failures=failures, log_tail=tail)
        else:
            self._requeue(t, failures=failures, log_tail=tail,
                          reason=f"exit code {event.exit_code}; retry {failures} of {retries}")
        return self._schedule()

    def _on_oom(self, event: TrialOutOfMemory) -> list[Command]:
        t = self._running_on(event.trial_id, event.node, event.attempt)
        assert t.demand is not None
        self._release(t.id)
        grown = max(math.ceil(t.demand.memory_mib * self.config.oom_growth),
                    event.observed_memory_mib + 1)
        node = self._nodes.get(t.node or "")
        gpu = node.gpus.get(t.gpu_index if t.gpu_index is not None else -1) if node else None
        if gpu is not None:
            # Future trials of this workload ask for the grown memory from the start.
            self._feedback(t.key, gpu.arch, grown, 0.0, t.id, oom_at=t.demand.memory_mib)
        largest = max((g.memory_mib for n in self._nodes.values() for g in n.gpus.values()),
                      default=0)
        if grown > largest:
            self._fail(t, f"out of memory: needs more than {t.demand.memory_mib} MiB, grown "
                          f"to {grown} MiB, larger than any GPU ({largest} MiB)",
                       memory_override_mib=grown)
        else:
            self._requeue(t, memory_override_mib=grown,
                          reason=f"out of memory at {t.demand.memory_mib} MiB; now asks "
                                 f"{grown} MiB")
        return self._schedule()

    def _on_profile(self, profile: Profile) -> list[Command]:
        slot = (profile.key, profile.arch)
        self._end_profile_job(slot)
        self._profiles[slot] = profile
        self._profile_failed.pop(slot, None)
        self._needs_cache.clear()
        self._store.put_profile(profile)
        return self._schedule()

    def _on_imported(self, event: ProfilesImported) -> list[Command]:
        for p in to_import(event.profiles, self._profiles, event.replace):
            self._profiles[p.key, p.arch] = p
            self._profile_failed.pop((p.key, p.arch), None)
            self._store.put_profile(p)
        self._needs_cache.clear()
        return self._schedule()

    def _on_profile_failed(self, event: ProfileFailed) -> list[Command]:
        slot = (event.key, event.arch)
        self._end_profile_job(slot)
        self._profile_failed[slot] = event.reason
        log.warning("profiling %s on %s failed: %s", event.key.label(), event.arch, event.reason)
        return self._schedule()

    # ----------------------------------------------------------------- feedback
    def _observe(self, t: TrialRecord, gpu: _Gpu, r: RunningTrial) -> None:
        """Keep a running trial's observed peaks; correct its profile when they exceed it."""
        if r.peak_memory_mib <= 0 and r.peak_utilization_pct <= 0:
            return
        before = self._observed.get(t.id)
        _, memory, util = before or (gpu.arch, 0, 0.0)
        peaks = (gpu.arch, max(memory, r.peak_memory_mib), max(util, r.peak_utilization_pct))
        if peaks != before:
            self._observed[t.id] = peaks
            self._feedback(t.key, *peaks, t.id)

    def _feedback(self, key: WorkloadKey, arch: str, memory_mib: int, util_pct: float,
                  trial_id: str, *, count: bool = False, oom_at: int | None = None) -> None:
        """Record a trial's observed peaks in its profile and raise the profile's demand
        where they exceed it (`oom_at`: the trial died of out-of-memory with that much)."""
        p = self._profiles.get((key, arch))
        if p is None:
            return
        update: dict[str, Any] = {}
        if memory_mib > p.observed_memory_mib:
            update["observed_memory_mib"] = memory_mib
        if util_pct > p.observed_compute_pct:
            update["observed_compute_pct"] = round(util_pct, 2)
        if count:
            update["observed_trials"] = p.observed_trials + 1
        demand = p.demand
        notes = []
        if memory_mib > demand.memory_mib:
            if oom_at is not None:
                new = memory_mib
                why = f"trial {trial_id} ran out of memory at {oom_at} MiB"
            else:
                new = math.ceil(memory_mib * (1 + self.config.feedback_margin))
                why = f"trial {trial_id} used {memory_mib} MiB"
            notes.append(f"memory {demand.memory_mib} -> {new} MiB ({why})")
            demand = Demand(compute_pct=demand.compute_pct, memory_mib=min(new, MAX_MEMORY_MIB),
                            cores=demand.cores)
        if util_pct > demand.compute_pct * (1 + self.config.feedback_compute_tolerance):
            notes.append(f"compute {demand.compute_pct:g} -> {util_pct:.4g} % (trial "
                         f"{trial_id} used {util_pct:.4g} %)")
            demand = Demand(compute_pct=min(round(util_pct, 2), MAX_COMPUTE_PCT),
                            memory_mib=demand.memory_mib, cores=demand.cores)
        if notes:
            update["demand"] = demand
            update["corrected"] = "; ".join(notes)
            log.info("profile of %s on %s corrected: %s", key.label(), arch, update["corrected"])
        if update:
            # Validated, not copied: nothing out of bounds reaches the store.
            corrected = Profile.model_validate({**dict(p), **update})
            self._profiles[key, arch] = corrected
            self._store.put_profile(corrected)
            if notes:
                self._needs_cache.clear()

    def _end_profile_job(self, slot: tuple[WorkloadKey, str]) -> None:
        for node in self._nodes.values():
            for gpu in node.gpus.values():
                if slot in (gpu.profiling, gpu.reserved_for):
                    self._journal.touch(node)
                if gpu.profiling == slot:
                    gpu.profiling = None
                if gpu.reserved_for == slot:
                    gpu.reserved_for = None

    # ----------------------------------------------------------------- state
    def _set(self, t: TrialRecord, **changes: Any) -> TrialRecord:
        if "state" in changes and changes["state"] != t.state:
            check_transition(t.id, t.state, changes["state"])
        new = t.model_copy(update=changes)
        if new.state.terminal != t.state.terminal:
            self._open[t.study_id] += -1 if new.state.terminal else 1
        self._trials[t.id] = new
        self._dirty.add(t.id)
        return new

    def _requeue(self, t: TrialRecord, **changes: Any) -> None:
        """Back to PENDING, holding no GPU."""
        self._set(t, state=TrialState.PENDING, node=None, gpu_index=None, demand=None,
                  **changes)

    def _fail(self, t: TrialRecord, reason: str, **changes: Any) -> None:
        """FAILED for good, with the reason a person will read."""
        self._set(t, state=TrialState.FAILED, node=None, gpu_index=None, reason=reason,
                  finished_at=self._clock.now(), **changes)
        self._maybe_done(t.study_id)

    def _set_study(self, study: StudyRecord, state: StudyState) -> None:
        self._studies[study.id] = study.model_copy(update={"state": state})
        self._dirty_studies.add(study.id)

    def _maybe_done(self, study_id: str) -> None:
        study = self._studies[study_id]
        if study.state == StudyState.ACTIVE and self._open[study_id] == 0:
            self._set_study(study, StudyState.COMPLETED)
            log.info("study %s completed", study_id)

    def _flush(self) -> None:
        # An id whose record a refused event added and the journal took back is skipped.
        for sid in sorted(self._dirty_studies):
            if sid in self._studies:
                self._store.update_study(self._studies[sid])
        for tid in sorted(self._dirty):
            if tid in self._trials:
                self._store.update_trial(self._trials[tid])
        self._dirty.clear()
        self._dirty_studies.clear()

    def _allocate(self, trial_id: str, node: _Node, gpu: _Gpu, demand: Demand) -> None:
        need = Need.of(demand)
        self._journal.touch(node)
        gpu.used_compute += need.compute
        gpu.used_memory += need.memory
        node.used_cores += need.cores
        gpu.trials.add(trial_id)

    def _release(self, trial_id: str) -> None:
        t = self._trials[trial_id]
        seen = self._observed.pop(trial_id, None)
        if seen is not None:
            self._feedback(t.key, seen[0], seen[1], seen[2], trial_id, count=True)
        node = self._nodes.get(t.node or "")
        if node is None or t.gpu_index is None or t.demand is None:
            return
        gpu = node.gpus[t.gpu_index]
        if trial_id in gpu.trials:
            self._journal.touch(node)
            need = Need.of(t.demand)
            gpu.used_compute -= need.compute
            gpu.used_memory -= need.memory
            node.used_cores -= need.cores
            gpu.trials.discard(trial_id)

    # ----------------------------------------------------------------- decisions
    def _policy(self, space: SearchSpace) -> Policy:
        name = self.config.policy or space.settings.policy
        if name not in self._policies:
            self._policies[name] = make_policy(name, **self.config.policy_options.get(name, {}))
        return self._policies[name]

    def _open_nodes(self) -> list[_Node]:
        return [n for _, n in sorted(self._nodes.items()) if not n.draining]

    def _needs(self, t: TrialRecord, archs: frozenset[str]) -> dict[str, Need]:
        ck = (t.key, t.memory_override_mib, archs)
        needs = self._needs_cache.get(ck)
        if needs is None:
            needs = {}
            for arch in sorted(archs):
                p = self._profiles.get((t.key, arch))
                if p is not None:
                    needs[arch] = Need.of(demand_with_override(p, t.memory_override_mib))
            self._needs_cache[ck] = needs
        return needs

    def _schedule(self) -> list[Command]:
        if self._deferred:
            self._schedule_wanted = True
            return []
        self._schedule_wanted = False
        commands: list[Command] = []
        open_nodes = self._open_nodes()
        archs = frozenset(g.arch for n in open_nodes for g in n.gpus.values())
        active = [s for s in self.studies() if s.state == StudyState.ACTIVE]
        commands += self._profile_missing(active, open_nodes, archs)
        for study in active:
            # One study's failed decision is undone and leaves the others to theirs.
            try:
                with self._undone_if_raises():
                    commands += self._decide(study, open_nodes, archs)
            except Exception:
                log.exception("the decision for study %s failed and was undone; it is "
                              "tried again at the next event", study.id)
        return commands

    def _decide(self, study: StudyRecord, open_nodes: list[_Node], archs: frozenset[str]
                ) -> list[Command]:
        """One policy run for one study's pending trials."""
        commands: list[Command] = []
        space = self._spaces[study.id]
        view = self._view(open_nodes, space.settings.oversubscription)
        batch: list[Item] = []
        # Trials with equal needs are interchangeable: once one fails to fit, so do
        # the rest. Pass each group only as many as could fit in the free compute,
        # plus one, so a decision costs what is placeable, not what is pending.
        # group -> (how many more to pass, needs, expected run time)
        groups: dict[tuple[WorkloadKey, int | None], tuple[int, dict[str, Need], float]] = {}
        for tid in self._by_study[study.id]:
            t = self._trials[tid]
            if t.state != TrialState.PENDING:
                continue
            group = (t.key, t.memory_override_mib)
            entry = groups.get(group)
            if entry is None:
                needs = self._needs(t, archs)
                run_time = max((self._profiles[t.key, a].run_time_s(t.epochs)
                                for a in needs), default=0.0)
                entry = (_fit_bound(needs, view) if needs else 0, needs, run_time)
            left, needs, run_time = entry
            groups[group] = (left - 1, needs, run_time)
            if left <= 0:
                continue
            batch.append(Item(t.id, needs, run_time))
        if not batch:
            return commands
        policy = self._policy(space)
        plan = policy.place(batch, view)
        check_plan(batch, view, plan)  # no plan over a capacity is ever launched
        self.decision_count += 1
        self.decision_time_s += plan.solve_time_s
        self.decisions.append(Decision(self._clock.now(), study.id, policy.name, len(batch),
                                       len(plan.placements), plan.solve_time_s, plan, view,
                                       tuple(batch)))
        for p in plan.placements:
            commands.append(self._launch(self._trials[p.item_id], p.node, p.gpu_index))
        return commands

    def _launch(self, t: TrialRecord, node_name: str, gpu_index: int) -> LaunchTrial:
        node = self._nodes[node_name]
        gpu = node.gpus[gpu_index]
        demand = demand_with_override(self._profiles[t.key, gpu.arch], t.memory_override_mib)
        t = self._set(t, state=TrialState.RUNNING, node=node_name, gpu_index=gpu_index,
                      demand=demand, launches=t.launches + 1, started_at=self._clock.now())
        self._allocate(t.id, node, gpu, demand)
        return LaunchTrial(trial_id=t.id, study_id=t.study_id, node=node_name,
                           gpu_index=gpu_index, params=dict(t.params), key=t.key,
                           demand=demand, epochs=t.epochs, attempt=t.launches)

    def _view(self, nodes: list[_Node], study_ratios: Mapping[str, float]) -> ClusterView:
        out = []
        for node in nodes:
            bins = []
            for idx in sorted(node.gpus):
                gpu = node.gpus[idx]
                cap = compute_capacity(self.config.ratio(gpu.arch, study_ratios))
                blocked = gpu.profiling is not None or gpu.reserved_for is not None
                slots: int | None = None
                if blocked:
                    slots = 0
                elif self.config.exclusive:
                    slots = max(0, 1 - len(gpu.trials))
                bins.append(GpuBin(node=node.spec.name, index=idx, arch=gpu.arch,
                                   compute=max(0, cap - gpu.used_compute),
                                   memory=max(0, gpu.memory_mib - gpu.used_memory),
                                   total_compute=cap, total_memory=gpu.memory_mib, slots=slots))
            total_cores = core_units(node.spec.cores)
            out.append(NodeBin(name=node.spec.name, cores=max(0, total_cores - node.used_cores),
                               gpus=tuple(bins), total_cores=total_cores))
        return ClusterView(nodes=tuple(out))

    def _profile_missing(self, active: list[StudyRecord], open_nodes: list[_Node],
                         archs: frozenset[str]) -> list[Command]:
        """Profile each (workload, architecture) the history lacks, on an idle GPU of that
        architecture; move trials between PENDING and PROFILING; fail those no
        architecture can run."""
        if not archs:
            return []
        commands: list[Command] = []
        in_flight = {g.profiling for n in self._nodes.values() for g in n.gpus.values()
                     if g.profiling is not None}
        in_flight |= {g.reserved_for for n in self._nodes.values() for g in n.gpus.values()
                      if g.reserved_for is not None}
        wanted: list[tuple[WorkloadKey, str]] = []
        for study in active:
            for tid in self._by_study[study.id]:
                t = self._trials[tid]
                if t.state not in (TrialState.PENDING, TrialState.PROFILING):
                    continue
                known = [a for a in archs if (t.key, a) in self._profiles]
                for arch in sorted(archs):
                    slot = (t.key, arch)
                    if (slot not in self._profiles and slot not in self._profile_failed
                            and slot not in in_flight and slot not in wanted):
                        wanted.append(slot)
                if known:
                    if t.state == TrialState.PROFILING:
                        self._set(t, state=TrialState.PENDING)
                elif all((t.key, a) in self._profile_failed for a in archs):
                    reasons = "; ".join(f"{a}: {self._profile_failed[t.key, a]}"
                                        for a in sorted(archs))
                    self._fail(t, f"profiling failed on every architecture ({reasons})")
                elif t.state == TrialState.PENDING:
                    self._set(t, state=TrialState.PROFILING)
        for key, arch in wanted:
            gpus = [(n, g) for n in open_nodes for _, g in sorted(n.gpus.items())
                    if g.arch == arch and g.profiling is None and g.reserved_for is None]
            if not gpus:
                continue
            idle = [(n, g) for n, g in gpus if not g.trials]
            if idle:
                node, gpu = idle[0]
                commands.append(self._profile_job(node, gpu, (key, arch)))
            else:
                # Let the least busy GPU drain, so that the profile does not starve.
                node, gpu = min(gpus, key=lambda ng: len(ng[1].trials))
                self._journal.touch(node)
                gpu.reserved_for = (key, arch)
        # A reserved GPU that drained starts its profile now.
        for node in open_nodes:
            for gpu in node.gpus.values():
                if gpu.reserved_for is not None and not gpu.trials and gpu.profiling is None:
                    self._journal.touch(node)
                    slot, gpu.reserved_for = gpu.reserved_for, None
                    commands.append(self._profile_job(node, gpu, slot))
        return commands

    def _profile_job(self, node: _Node, gpu: _Gpu, slot: tuple[WorkloadKey, str]
                     ) -> ProfileWorkload:
        self._journal.touch(node)
        gpu.profiling = slot
        return ProfileWorkload(key=slot[0], arch=slot[1], node=node.spec.name,
                               gpu_index=gpu.spec_index,
                               iterations=self.config.profile_iterations,
                               warmup=self.config.profile_warmup)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _fit_bound(needs: Mapping[str, Need], view: ClusterView) -> int:
    """An upper bound on how many items with these needs fit in the view, plus one."""
    total = 0
    for node in view.nodes:
        for gpu in node.gpus:
            need = needs.get(gpu.arch)
            if need is None:
                continue
            if need.compute <= 0 and need.memory <= 0:
                return 1 << 30
            by_compute = gpu.compute // need.compute if need.compute > 0 else 1 << 30
            by_memory = gpu.memory // need.memory if need.memory > 0 else 1 << 30
            total += min(by_compute, by_memory)
    return total + 1
