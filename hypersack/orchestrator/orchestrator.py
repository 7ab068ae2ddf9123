"""The orchestrator: a deterministic state machine over studies, trials, nodes and profiles.

`handle(event)` applies one event, persists every change through the injected Store in
one transaction, decides again where capacity or demand changed, and returns the
commands for the drivers to carry out. It reads time only from the injected clock.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from hypersack.core.clock import Clock
from hypersack.core.errors import (
    HyperSackError,
    InvalidInput,
    NotFound,
    StaleEvent,
    StoreUnavailable,
)
from hypersack.core.types import (
    MAX_RUNG_VALUES,
    Demand,
    NodeRecord,
    Profile,
    StudyRecord,
    StudyState,
    TrialRecord,
    TrialState,
    UserShare,
    WorkloadKey,
)
from hypersack.grid import rungs
from hypersack.grid.adaptive import OptunaSearch, check_search
from hypersack.grid.expand import asked_trial, expand
from hypersack.grid.space import SearchSpace, parse_space
from hypersack.grid.trial import check_transition
from hypersack.orchestrator import fusion, shares
from hypersack.orchestrator.cluster import ClusterState, Gpu, Node
from hypersack.orchestrator.commands import (
    Command,
    DropCheckpoint,
    KillTrial,
    LaunchGroup,
    LaunchTrial,
    ProfileWorkload,
)
from hypersack.orchestrator.cycle import CycleState
from hypersack.orchestrator.events import (
    Event,
    Heartbeat,
    NodeDrained,
    NodeJoined,
    NodeLost,
    ProfileFailed,
    ProfileMeasured,
    ProfilesForgotten,
    ProfilesImported,
    RunningTrial,
    StudyCancelled,
    StudySubmitted,
    Tick,
    TrialFailed,
    TrialFinished,
    TrialOutOfMemory,
    TrialProgress,
    TrialsAsked,
    TrialStarted,
    Wake,
)
from hypersack.orchestrator.journal import Journal, JournaledDict, JournaledLog, journaled
from hypersack.orchestrator.outcomes import divergence, missing_objective
from hypersack.orchestrator.retries import after_failure, after_out_of_memory
from hypersack.policies.base import (
    COMPUTE_SCALE,
    CORE_SCALE,
    ClusterView,
    Item,
    Need,
    Placement,
    Plan,
    PlanError,
    Policy,
    check_plan,
    compute_capacity,
    core_units,
    default_value,
)
from hypersack.policies.registry import make_policy
from hypersack.sampler import planning
from hypersack.sampler.feedback import corrected
from hypersack.sampler.planning import Slot
from hypersack.sampler.profiles import demand_with_override, to_import
from hypersack.store.base import Store

log = logging.getLogger(__name__)

DEFAULT_RATIOS: dict[str, float] = {"A100": 3.0, "H100": 2.5}
_DEFAULT_SHARE = UserShare()
MAX_RESERVED = 32  # GPUs one study may have reserved for its waiting trials at once
MAX_EXPLAINED_GPUS = 64  # `hypersack why` lists at most this many GPUs
_RUNG_ORDER = 10_000_000  # more than a study's trials: promoted trials wait first
# A trial that waits (PENDING, PAUSED) holds no GPU and is in no fused group.
_HOLDS_NOTHING: dict[str, Any] = {"node": None, "gpu_index": None, "demand": None,
                                  "group": "", "group_width": 0}


@dataclass(frozen=True)
class OrchestratorConfig:
    """Server-wide settings; a study's own settings override the ratios and the policy."""

    oversubscription: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RATIOS))
    default_ratio: float = 1.0
    heartbeat_timeout_s: float = 30.0
    restore_grace_s: float = 30.0  # extra time for the nodes of a restarted server
    # A node's heartbeats list what it runs (and the trials whose exits it has yet to see
    # acknowledged): a trial held RUNNING there that its heartbeats leave out for longer
    # than this, with no exit, goes back to PENDING for its next attempt (its launch was
    # lost, or its agent restarted without it).
    missing_grace_s: float = 15.0
    exclusive: bool = False  # one trial per GPU: the baseline the paper compares against
    fusion: bool = True  # False: no fused groups for any study (packing alone)
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
    # The longest an Optuna search's sampler may ask for new trials in one decision (a
    # GP sampler's ask takes tenths of a second, and the server's lock is held): what is
    # left is asked at the next tick. None: no bound (the simulator, for repeatable runs).
    ask_budget_s: float | None = 0.1
    # Fair share, quotas and the highest priority each user may ask for, by user name
    # ("*": everyone not named); see `shares`.
    shares: Mapping[str, UserShare] = field(default_factory=dict)

    def share_rule(self, user: str) -> UserShare:
        rule = self.shares.get(user) or self.shares.get("*")
        return rule if rule is not None else _DEFAULT_SHARE

    def ratio(self, arch: str, study_ratios: Mapping[str, float]) -> float:
        if arch in study_ratios:
            return study_ratios[arch]
        return self.oversubscription.get(arch, self.default_ratio)


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
        # PENDING trials per study (trial id -> its place in the study), so a decision
        # costs what waits, not the study's size.
        self._waiting: dict[str, JournaledDict[str, int]] = journaled(j)
        # Per study, how many PENDING trials each workload group (see `_group`) has.
        # `_plain_items` stops scanning once every group waiting has passed what could fit.
        self._pending_groups: dict[str, JournaledDict[tuple[int, int | None, float], int]] = \
            journaled(j)
        self._place: dict[str, int] = journaled(j)  # trial id -> its place in its study
        # Caches. A small number per workload key (append-only: a key keeps its number, so
        # the journaled group counts stay valid), and each trial's, invalidated by any
        # rollback (an undone submission's trial ids come back with other keys).
        self._key_numbers: dict[WorkloadKey, int] = {}
        self._key_of_trial: dict[str, int] = {}
        self._cluster = ClusterState(j, self.config.ratio, self.config.exclusive)
        self._profiles: dict[Slot, Profile] = journaled(j)
        self._profile_failed: dict[Slot, str] = journaled(j)
        # trial: arch, peak MiB, peak %
        self._observed: dict[str, tuple[str, int, float]] = journaled(j)
        # fused group -> its members still running
        self._groups: dict[str, tuple[str, ...]] = journaled(j)
        self._oom_groups: dict[str, bool] = journaled(j)  # groups whose OOM was counted
        self._paused: dict[str, int] = journaled(j)  # PAUSED trials per study
        # (study, rung) -> when the rung's promotions held for its window resume
        self._windows: dict[tuple[str, int], float] = journaled(j)
        # Trials pruned while handling the current event, and the node of their
        # checkpoint: DropCheckpoint commands once the event's handling stands.
        self._drops: list[tuple[str, str]] = []
        # Studies with an Optuna search: their Optuna study, saved whole by the journal
        # (an undone event leaves it stale, and it is rebuilt from the trial records).
        self._searches: dict[str, OptunaSearch] = journaled(j)
        # Caches: each bracket's rungs (never wrong), and per study the rankings at each
        # (bracket, rung), built from the trial records when first needed and dropped
        # whenever an event is undone.
        self._ladders: dict[tuple[str, int], tuple[int, ...]] = {}
        # The last epoch each running trial of a pruned study reported (not kept across a
        # restart): a trial that ran past the rung it was to pause at did not pause.
        self._last_step: dict[str, int] = journaled(j)
        # Running trials a live node's heartbeats leave out, and since when (not kept
        # across a restart: a restarted server counts afresh).
        self._missing: dict[str, float] = journaled(j)
        self._rankings: dict[str, dict[tuple[int, int], rungs.Ranking]] = {}
        self._needs_cache: dict[tuple[WorkloadKey, int | None, frozenset[str]],
                                dict[str, Need]] = {}
        self._dirty: set[str] = set()
        self._dirty_studies: set[str] = set()
        # The recent policy runs, how many there were and their solve time: an undone
        # decision is neither kept nor counted (`plan` and /metrics read them as fact).
        self.decisions: JournaledLog[Decision] = JournaledLog(
            j, self.config.decision_log, lambda d: d.solve_time_s)
        self._deferred = False
        self._schedule_wanted = False
        # Profile bookkeeping scans every waiting trial: it runs only after something
        # it depends on changed (studies, profiles, nodes) or while a profile job waits
        # for a GPU to drain.
        self._profiling_dirty = True
        self._profiling_waiting = False
        self._decide_again = False  # a decision failed: the next tick tries again
        j.on_rollback(self._forget_caches)
        # Event dispatch: one handler per event type.
        self._handlers: dict[type, Callable[[Any], list[Command]]] = dict([
            _handler(TrialProgress, self._on_progress),
            _handler(TrialStarted, self._on_progress),
            _handler(Heartbeat, self._on_heartbeat),
            _handler(TrialFinished, self._on_finished),
            _handler(TrialFailed, self._on_failed),
            _handler(TrialOutOfMemory, self._on_oom),
            _handler(StudySubmitted, self._on_submitted),
            _handler(StudyCancelled, self._on_cancelled),
            _handler(TrialsAsked, self._on_asked),
            _handler(NodeJoined, self._on_joined),
            _handler(NodeLost, self._on_lost),
            _handler(NodeDrained, self._on_drained),
            _handler(ProfileMeasured, self._on_profile),
            _handler(ProfileFailed, self._on_profile_failed),
            _handler(ProfilesImported, self._on_imported),
            _handler(ProfilesForgotten, self._on_forgotten),
            _handler(Tick, self._on_tick),
            _handler(Wake, self._on_wake),
        ])
        self._restore()

    def _forget_caches(self) -> None:
        """Every cache derived from journaled state, invalidated after a rollback."""
        self._key_of_trial.clear()
        self._needs_cache.clear()  # it may hold needs of a profile that was undone
        self._rankings.clear()  # they may hold a rung value that was undone
        self._ladders.clear()  # a study id may come back with another space
        self._profiling_dirty = True  # what was planned may have been undone

    @property
    def decision_count(self) -> int:
        return self.decisions.count

    @property
    def decision_time_s(self) -> float:
        return self.decisions.total

    # ----------------------------------------------------------------- restore
    def _restore(self) -> None:
        """Rebuild from the store: a restarted server resumes every study where it was."""
        now = self._clock.now()
        for p in self._store.list_profiles():
            self._profiles[p.key, p.arch] = p
        # Restored nodes get a grace period: their agents need a moment to find the
        # restarted server before silence means they are gone.
        for rec in self._store.list_nodes():
            self._cluster.add(rec, now + self.config.restore_grace_s)
        for study in self._store.list_studies():
            self._studies[study.id] = study
            self._spaces[study.id] = parse_space(study.space, source=f"study {study.id}")
            self._by_study[study.id] = []
            self._open[study.id] = 0
        for t in self._store.list_trials():
            self._trials[t.id] = t
            self._by_study.setdefault(t.study_id, []).append(t.id)
            self._place[t.id] = len(self._by_study[t.study_id]) - 1  # as when submitted
            if t.state == TrialState.PENDING:
                self._waiting_in(t.study_id)[t.id] = self._wait_order(t)
                self._count_group(t, 1)
            self._open[t.study_id] = self._open.get(t.study_id, 0) + (not t.state.terminal)
            if t.state == TrialState.PAUSED:
                self._paused[t.study_id] = self._paused.get(t.study_id, 0) + 1
            if t.state == TrialState.RUNNING:
                node = self._cluster.get(t.node)
                gpu = self._cluster.gpu(t.node, t.gpu_index)
                if node is None or gpu is None or t.demand is None:
                    # Its node is gone from the inventory: run it again.
                    self._requeue(t)
                else:
                    self._cluster.allocate(t.id, node, gpu, t.demand)
                    if t.group:
                        self._groups[t.group] = (*self._groups.get(t.group, ()), t.id)
        if self._dirty:
            with self._store.transaction():
                self._flush()
        log.info("restored %d studies, %d trials, %d nodes, %d profiles", len(self._studies),
                 len(self._trials), len(self._cluster), len(self._profiles))

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
        return name in self._cluster

    def nodes(self) -> list[NodeRecord]:
        return [n.record() for n in self._cluster]

    def profiles(self) -> list[Profile]:
        return list(self._profiles.values())

    def held(self, node: str, gpu_index: int) -> tuple[int, int, int]:
        """What a GPU has given out: compute units, memory MiB and trials."""
        gpu = self._cluster.gpu(node, gpu_index)
        if gpu is None:
            raise NotFound(f"no GPU {node}:{gpu_index}")
        return gpu.used_compute, gpu.used_memory, len(gpu.trials)

    def gpu_trials(self, node: str, gpu_index: int) -> frozenset[str]:
        """The trials a GPU holds."""
        gpu = self._cluster.gpu(node, gpu_index)
        if gpu is None:
            raise NotFound(f"no GPU {node}:{gpu_index}")
        return frozenset(gpu.trials)

    def decision_inputs(self) -> dict[str, Any]:
        """What the next decision reads, comparable between two orchestrators (a live one
        and one rebuilt from its store): each active study's waiting trials in order with
        their needs, its pending counts per workload group, and the cluster's free
        capacity as the policies see it."""
        open_nodes = self._cluster.open_nodes()
        archs = frozenset().union(*[n.archs() for n in open_nodes])
        key_of = {number: key for key, number in self._key_numbers.items()}
        out: dict[str, Any] = {"view": self._cluster.view(open_nodes, {})}
        for s in self.studies():
            if s.state != StudyState.ACTIVE:
                continue
            pending = [(t.id, t.state, sorted(self._needs(t, archs).items()))
                       for t in self._pending_of(s.id)]
            counts = {(key_of[number].label(), override, segment): n
                      for (number, override, segment), n in
                      (self._pending_groups.get(s.id) or {}).items()}
            out[s.id] = (pending, counts)
        return out

    def gpu_load(self) -> dict[tuple[str, int], tuple[int, float]]:
        """(node, GPU index) -> (trials running, scaled-compute share used, 0..1)."""
        return self._cluster.gpu_load()

    def explain(self, trial_id: str, others: bool = True) -> list[str]:
        """Why a trial is where it is, for people (`hypersack why`): for a waiting trial,
        what blocks it on each GPU and what holds its study back. Reads, changes nothing.
        `others`: name other studies (else only count them)."""
        t = self.trial(trial_id)
        study = self._studies[t.study_id]
        head = f"{t.id} is {t.state.value}"
        if t.state == TrialState.RUNNING:
            return [f"{head} on {t.node}:{t.gpu_index} (attempt {t.launches})"
                    + (f", fused group {t.group} of {t.group_width}" if t.group else "")]
        if t.state == TrialState.PAUSED:
            return [f"{head} at epoch {t.done_epochs:g}, waiting for the rung's other "
                    "trials: the pruner promotes the best of each rung and prunes the rest",
                    *self._explain_windows(t.study_id)]
        if t.state not in (TrialState.PENDING, TrialState.PROFILING):
            return [head + (f": {t.reason}" if t.reason else "")]
        if study.state != StudyState.ACTIVE:
            return [f"{head}, but its study is {study.state.value}"]
        open_nodes = self._cluster.open_nodes()
        out = [head]
        closed = sorted(n.spec.name for n in self._cluster if n.draining)
        if closed:
            out.append(f"draining, so taking no new work: {', '.join(closed[:20])}")
        if not open_nodes:
            out.append("no node is connected and open: start an agent, or undrain a node")
            return out
        archs = frozenset().union(*[n.archs() for n in open_nodes])
        needs = self._needs(t, archs)
        for arch in sorted(archs - set(needs)):
            failed = self._profile_failed.get((t.key, arch))
            out.append(f"{arch}: " + (f"profiling failed: {failed}" if failed else
                       "waiting for its workload's profile there (each workload is "
                       "profiled once per architecture)"))
        out += self._explain_gpus(t, open_nodes, needs)
        out += self._explain_queue(t, others)
        return out

    def _explain_gpus(self, t: TrialRecord, open_nodes: list[Node],
                      needs: Mapping[str, Need]) -> list[str]:
        ratios = self._spaces[t.study_id].settings.oversubscription
        lines: list[str] = []
        fits = 0
        for node in open_nodes:
            free_cores = core_units(node.spec.cores) - node.used_cores
            for idx, gpu in sorted(node.gpus.items()):
                need = needs.get(gpu.arch)
                if need is None:
                    continue
                cap = compute_capacity(self.config.ratio(gpu.arch, ratios))
                why: list[str] = []
                if gpu.profiling is not None:
                    why.append("it runs a profile job")
                if gpu.reserved_for is not None:
                    why.append("it drains for a profile job")
                if self.config.exclusive and gpu.trials:
                    why.append("one trial per GPU (exclusive) and it has one")
                if gpu.used_compute + need.compute > cap:
                    why.append(f"compute: needs {need.compute / COMPUTE_SCALE:g}%, "
                               f"{max(0, cap - gpu.used_compute) / COMPUTE_SCALE:g}% of "
                               f"{cap / COMPUTE_SCALE:g}% free")
                if gpu.used_memory + need.memory > gpu.memory_mib:
                    why.append(f"memory: needs {need.memory} MiB, "
                               f"{max(0, gpu.memory_mib - gpu.used_memory)} MiB of "
                               f"{gpu.memory_mib} free")
                if need.cores > free_cores:
                    why.append(f"cores: needs {need.cores / CORE_SCALE:g}, node has "
                               f"{max(0, free_cores) / CORE_SCALE:g} of "
                               f"{node.spec.cores:g} free")
                fits += not why
                if len(lines) < MAX_EXPLAINED_GPUS:
                    lines.append(f"{node.spec.name}:{idx} ({gpu.arch}, {len(gpu.trials)} "
                                 f"trials): " + ("; ".join(why) if why else "fits now"))
        shown = sum(len(n.gpus) for n in open_nodes)
        if shown > MAX_EXPLAINED_GPUS:
            lines.append(f"... and {shown - MAX_EXPLAINED_GPUS} more GPUs")
        if fits:
            lines.append(f"fits on {fits} GPU(s) now: it is placed at the next decision "
                         "unless its study's share, its user's quota or trials ahead of it "
                         "take the room first")
        return lines

    def _explain_queue(self, t: TrialRecord, others: bool) -> list[str]:
        """What holds the study back: trials ahead, its share, its user's quota, and
        studies of a higher priority."""
        lines: list[str] = []
        waiting: Mapping[str, int] = self._waiting.get(t.study_id) or {}
        mine = self._wait_order(t)
        ahead = sum(1 for order in waiting.values() if order < mine)  # their wait orders
        if ahead:
            lines.append(f"{ahead} trial(s) of its study wait ahead of it")
        active = [s for s in self.studies() if s.state == StudyState.ACTIVE]
        claims, quotas = self._claims(active)
        by_id = {c.study_id: c for c in claims}
        claim = by_id[t.study_id]
        rule = self.config.share_rule(claim.user)
        quota = quotas[claim.user]
        if quota.compute is not None and quota.compute <= shares.EPS:
            lines.append(f"its user {claim.user or '(local)'} has used their quota of "
                         f"{rule.max_compute:g} GPU-equivalents of compute")
        if quota.gpus is not None and quota.gpus <= 0:
            lines.append(f"its user {claim.user or '(local)'} occupies their quota of "
                         f"{rule.max_gpus} GPUs (it fits only where they already run)")
        above = [c for c in claims if c.priority > claim.priority and c.pending]
        if above:
            lines.append(f"{len(above)} studies of a higher priority wait and go first"
                         + (": " + ", ".join(f"{c.study_id} (priority {c.priority})"
                                             for c in above[:10]) if others else ""))
        level = [c for c in claims if c.priority == claim.priority]
        if len(level) > 1:
            capacity = float(sum(len(n.gpus) for n in self._cluster.open_nodes()))
            capacity -= sum(c.used for c in claims if c.priority > claim.priority)
            fair = shares.targets(level, capacity, self._user_weight)
            share = fair.get(t.study_id, 0.0)
            line = (f"fair share: its study holds {claim.used:.2f} of {share:.2f} "
                    f"GPU-equivalents (weight {claim.weight:g}, {len(level)} active "
                    f"studies at priority {claim.priority})")
            if claim.used >= share - shares.EPS:
                under = [c for c in level if c.pending and c.study_id != t.study_id
                         and c.used < fair.get(c.study_id, 0.0) - shares.EPS]
                line += "; at or over its share, so "
                line += (", ".join(f"{c.study_id} ({c.used:.2f} of "
                                   f"{fair.get(c.study_id, 0.0):.2f})" for c in under[:10])
                         if others and under else
                         f"{len(under)} studies under theirs" if under else "others")
                line += " go first"
            lines.append(line)
        return lines + self._explain_windows(t.study_id)

    def _explain_windows(self, study_id: str) -> list[str]:
        now = self._clock.now()
        return [f"rung {rung}'s promotions wait {due - now:.1f} s more for their window "
                "(promotion_window_s), to be placed together"
                for (sid, rung), due in sorted(self._windows.items())
                if sid == study_id and due > now]

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
        is undone and StoreUnavailable raised: a failure of the store at any point (an
        event's savepoint too) is no event's fault, and refuses none of them, so that
        their senders can give them again."""
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
        except BaseException as exc:
            self._journal.rollback_to(0)
            self._decide_again = True
            self._dirty.clear()
            self._dirty_studies.clear()
            if self._store.failed(exc) and not isinstance(exc, StoreUnavailable):
                raise StoreUnavailable(str(exc)[:300]) from exc
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
            raise

    def _guarded(self, event: Event | None, result: BatchResult) -> None:
        """Handle one event (None: decide), undoing all it did if it raises."""
        try:
            with self._undone_if_raises():
                commands = self._dispatch(event) if event is not None else self._schedule()
        except StaleEvent as exc:
            result.stale.append(exc)
        except Exception as exc:
            if self._store.failed(exc):
                raise  # the whole batch is undone: see handle_batch
            what = "a decision" if event is None else _short(repr(event))
            if isinstance(exc, HyperSackError):
                log.warning("refused %s: %s", what, exc)
            else:
                log.exception("refused %s: its handling failed; nothing changed", what)
            if event is not None:
                result.refused.append((event, exc))
            else:
                self._decide_again = True
        else:
            result.commands += commands + self._checkpoints_to_drop()
        finally:
            self._drops.clear()

    def _checkpoints_to_drop(self) -> list[Command]:
        """The checkpoints of the trials pruned by what was just handled (those an undone
        part took back are no longer PRUNED, and keep theirs)."""
        return [DropCheckpoint(tid, self._trials[tid].study_id, node)
                for tid, node in self._drops
                if tid in self._trials and self._trials[tid].state == TrialState.PRUNED]

    def _dispatch(self, event: Event) -> list[Command]:
        handler = self._handlers.get(type(event))
        if handler is None:
            raise InvalidInput(f"unknown event {_short(repr(event))}")
        if not isinstance(event, _ROUTINE):
            self._profiling_dirty = True
        return handler(event)

    def _on_progress(self, event: TrialProgress | TrialStarted) -> list[Command]:
        t = self._running_on(event.trial_id, event.node, event.attempt)
        if not isinstance(event, TrialProgress):
            return []
        why = divergence(self._spaces[t.study_id].settings, event.metrics, event.nonfinite)
        if why is None:
            return self._at_rung(t, event)
        # Stopped now: its capacity goes to a trial that may still converge.
        return self._end_now(t, TrialState.DIVERGED, why, event)

    def _end_now(self, t: TrialRecord, state: TrialState, why: str, event: TrialProgress
                 ) -> list[Command]:
        """Stop a running trial for good as it reports (diverged, pruned): its process is
        killed and its capacity goes to the next decision at once."""
        node = t.node or event.node
        if state == TrialState.PRUNED:
            self._drops.append((t.id, node))
        self._release(t.id)
        self._set(self._trials[t.id], state=state, node=None, gpu_index=None, reason=why,
                  metrics=dict(event.metrics), finished_at=self._clock.now())
        self._maybe_done(t.study_id)
        log.info("%s %s", t.id, why)
        return [KillTrial(t.id, node, why, attempt=t.launches), *self._schedule()]

    def _on_heartbeat(self, event: Heartbeat) -> list[Command]:
        node = self._cluster.live(event.node)
        self._cluster.seen(node, self._clock.now())
        return self._reconcile(node, event.running, joined=False)

    def _on_lost(self, event: NodeLost) -> list[Command]:
        self._cluster.live(event.node)
        self._lose(event.node, event.reason)
        return self._schedule()

    def _on_drained(self, event: NodeDrained) -> list[Command]:
        node = self._cluster.live(event.node)
        self._cluster.touch(node)
        node.draining = event.draining
        self._store.put_node(node.record())
        return [] if event.draining else self._schedule()

    def _on_tick(self, event: Tick) -> list[Command]:
        """Nodes silent too long are lost. A tick decides only then, or where the last
        decision failed: with nothing changed, a decision would find what the last one
        found."""
        timeout = self.config.heartbeat_timeout_s
        now = self._clock.now()
        silent = self._cluster.silent(now, timeout)
        for name in silent:
            self._lose(name, f"no heartbeat for {timeout:g} s")
        due = self._release_due(now)
        return self._schedule() if silent or due or self._decide_again else []

    def _on_wake(self, event: Wake) -> list[Command]:
        return self._schedule() if self._release_due(self._clock.now()) else []

    def _release_due(self, now: float) -> bool:
        """Promotions whose window passed resume; True if there were any."""
        due = sorted({sid for (sid, _), at in self._windows.items() if at <= now})
        for sid in due:
            self._rung_decisions(sid)
            self._maybe_done(sid)
        return bool(due)

    def wake_at(self) -> float | None:
        """The next time a tick has something to do besides checking heartbeats (a held
        promotion resuming); None: nothing waits on time."""
        return min(self._windows.values(), default=None)

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
        if exit and attempt and attempt <= t.exited:
            raise StaleEvent(f"trial {trial_id}: the exit of attempt {attempt} was handled "
                             "already")
        if exit and attempt and t.state == TrialState.PENDING and t.launched_on == node:
            log.info("%s: the exit of attempt %d arrived after its node was lost; it counts",
                     trial_id, attempt)
            return t
        if t.state != TrialState.RUNNING or t.node != node:
            raise StaleEvent(f"trial {trial_id} is {t.state.value}"
                             + (f" on {t.node}" if t.node else "") + f", not running on {node}")
        return t

    def _exit_of(self, event: TrialFinished | TrialFailed | TrialOutOfMemory, *,
                 late: bool = True) -> TrialRecord:
        """The trial whose attempt exited, marked as exited in that attempt (a repeat of
        the exit is then stale). `late`: the exit counts after a loss of its node too."""
        t = self._running_on(event.trial_id, event.node, event.attempt, exit=late)
        if event.attempt:
            t = self._set(t, exited=event.attempt)
        return t

    def _on_submitted(self, event: StudySubmitted) -> list[Command]:
        space = event.space
        seq = max((s.seq for s in self._studies.values()), default=0) + 1
        # Numbered per name (sp1-1, sp1-2, ...). Unique: a name never ends in -<digits>
        # of another name's number, as the number is always the last dash's part.
        number = 1 + sum(s.name == space.name for s in self._studies.values())
        study_id = f"{space.name}-{number}"
        while study_id in self._studies:  # a name like "a-1" beside "a": never reused
            number += 1
            study_id = f"{space.name}-{number}"
        study = StudyRecord(id=study_id, name=space.name, space=space.model_dump(mode="json"),
                            submitted_at=self._clock.now(), seq=seq, owner=event.owner)
        check_search(space)  # a sampler this server cannot run is refused now
        trials = expand(space, study_id)
        self._store.add_study(study, trials)
        self._studies[study_id] = study
        self._spaces[study_id] = space
        self._by_study[study_id] = [t.id for t in trials]
        self._open[study_id] = len(trials)
        waiting = self._waiting_in(study_id)
        for i, t in enumerate(trials):
            self._trials[t.id] = t
            self._place[t.id] = i
            if t.state == TrialState.PENDING:
                waiting[t.id] = self._wait_order(t)
                self._count_group(t, 1)
        # A new study profiles again what failed before: its user may have fixed the
        # program since (the failure is not the workload's for good).
        keys = {t.key for t in trials}
        for slot in [s for s in self._profile_failed if s[0] in keys]:
            log.info("study %s: profiling %s on %s again (it failed before: %s)", study_id,
                     slot[0].label(), slot[1], _short(self._profile_failed[slot], 200))
            del self._profile_failed[slot]
        log.info("study %s submitted: %d trials%s", study_id, space.size(),
                 f" (asked of Optuna's {space.search.sampler} sampler as capacity frees)"
                 if space.search.adaptive else "")
        return self._schedule()

    def _on_asked(self, event: TrialsAsked) -> list[Command]:
        """Trials given by the owner of a manual search, run like any others."""
        study = self.study(event.study_id)
        space = self._spaces[study.id]
        if space.search.type != "manual":
            raise InvalidInput(f"study {study.id} searches by {space.search.type}; only a "
                               "study with search type manual takes trials from outside")
        if study.state != StudyState.ACTIVE:
            raise InvalidInput(f"study {study.id} is {study.state.value}")
        left = self._asks_left(study.id)
        if len(event.params) > left:
            raise InvalidInput(f"study {study.id} takes {left} more trial(s) (search.trials "
                               f"= {space.size()}); {len(event.params)} given")
        if not event.params:
            return []
        start = len(self._by_study[study.id])
        self._add_trials(study.id, [
            asked_trial(space, study.id, start + i, space.point(p))
            for i, p in enumerate(event.params)])
        return self._schedule()

    def _on_cancelled(self, event: StudyCancelled) -> list[Command]:
        study_id = event.study_id
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
        self._rung_decisions(study_id)  # closes its promotion windows
        return commands + self._schedule()

    def _on_joined(self, event: NodeJoined) -> list[Command]:
        spec = event.node
        old = self._cluster.get(spec.name)
        now = self._clock.now()
        if old is not None and old.spec != spec:
            # Same name, new inventory (a GPU appeared or failed): keep what still runs.
            self._lose(spec.name, "re-registered with a different inventory")
            old = None
        if old is None:
            node = self._cluster.add(NodeRecord(spec=spec, draining=False), now)
            self._store.put_node(node.record())
            log.info("node %s joined: %d GPUs, %g cores", spec.name, len(spec.gpus), spec.cores)
        else:
            node = old
            self._cluster.seen(node, now)
        return self._reconcile(node, event.running, joined=True) + self._schedule()

    def _reconcile(self, node: Node, running: Iterable[RunningTrial], *, joined: bool
                   ) -> list[Command]:
        """Adopt what the node runs for us, kill what it runs that we do not want, and
        requeue what it should run but does not: at once on (re)registration, after
        `missing_grace_s` of heartbeats that leave it out otherwise."""
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
            if (t is not None and gpu is not None
                    and t.state in (TrialState.PENDING, TrialState.PROFILING)
                    and t.launched_on == node.spec.name):
                # Only what this node was given, in its latest attempt: a node cannot
                # claim a trial it never ran.
                profile = self._profiles.get((t.key, gpu.arch))
            if t is not None and gpu is not None and profile is not None:
                demand = demand_with_override(profile, t.memory_override_mib)
                self._set(t, state=TrialState.RUNNING, node=node.spec.name,
                          gpu_index=gpu.spec_index, demand=demand)
                self._cluster.allocate(t.id, node, gpu, demand)
                log.info("adopted %s on %s:%d", t.id, node.spec.name, gpu.spec_index)
            else:
                commands.append(KillTrial(r.trial_id, node.spec.name,
                                          "not scheduled here (duplicate or unknown)"))
        now = self._clock.now()
        requeued = False
        for tid in reported & self._missing.keys():
            del self._missing[tid]
        for gpu in node.gpus.values():
            for tid in sorted(gpu.trials - reported):
                if not joined:
                    since = self._missing.setdefault(tid, now)
                    if now - since <= self.config.missing_grace_s:
                        continue
                self._release(tid)
                self._requeue(self._trials[tid], reason=f"not running on {node.spec.name}"
                              + ("" if joined else f" (left out of its heartbeats for "
                                 f"{now - since:.0f} s, and no exit came)"))
                log.info("%s is not running on %s; requeued", tid, node.spec.name)
                requeued = True
        if requeued and not joined:  # a join decides anyway
            commands += self._schedule()
        return commands

    def _lose(self, name: str, reason: str) -> None:
        self._profiling_dirty = True  # its profile jobs and GPUs are gone
        node = self._cluster.remove(name)
        self._store.remove_node(name)
        for gpu in node.gpus.values():
            for tid in sorted(gpu.trials):
                t = self._trials[tid]
                self._groups.pop(t.group, None)
                self._requeue(t)
            gpu.trials.clear()
        log.warning("node %s lost (%s); its trials are pending again", name, reason)

    def _on_finished(self, event: TrialFinished) -> list[Command]:
        t = self._exit_of(event)
        self._release(t.id)
        if self._paused_at_rung(t, event):
            return self._schedule()
        settings = self._spaces[t.study_id].settings
        objective = event.objective
        if objective is None:
            objective = event.metrics.get(settings.objective.metric)
        why = divergence(settings, event.metrics, event.nonfinite)
        missing = None if why or objective is not None else \
            missing_objective(settings, event.metrics)
        self._set(t, state=TrialState.DIVERGED if why else TrialState.COMPLETED,
                  metrics=dict(event.metrics), objective=None if why else objective,
                  finished_at=self._clock.now(), reason=why or missing or "",
                  log_tail=event.log_tail[-4000:])
        if missing:
            self._warn(t.study_id, missing)
        self._maybe_done(t.study_id)
        return self._schedule()

    def _warn(self, study_id: str, text: str) -> None:
        """A warning on the study, once: the first trial that gives cause says it."""
        study = self._studies[study_id]
        if len(study.warnings) >= 8 or any(w.split(" (")[0] == text.split(" (")[0]
                                           for w in study.warnings):
            return
        self._studies[study_id] = study.model_copy(update={"warnings": (*study.warnings, text)})
        self._dirty_studies.add(study_id)
        log.warning("study %s: %s", study_id, text)

    def _on_failed(self, event: TrialFailed) -> list[Command]:
        t = self._exit_of(event)
        self._release(t.id)
        if event.fenced:
            self._requeue(t, reason=f"stopped on {event.node} by its fence (its agent did "
                                    "not hear from the server in time); it runs again, no "
                                    "failure counted")
            return self._schedule()
        after = after_failure(event.exit_code, t.failures,
                              self._spaces[t.study_id].settings.retries)
        tail = event.log_tail[-4000:]
        if after.give_up:
            self._fail(t, after.reason, failures=after.failures, log_tail=tail)
        else:
            self._requeue(t, failures=after.failures, log_tail=tail, reason=after.reason)
        return self._schedule()

    def _on_oom(self, event: TrialOutOfMemory) -> list[Command]:
        t = self._exit_of(event, late=False)
        assert t.demand is not None
        if t.group_width > 1:
            return self._group_oom(t, event)
        self._release(t.id)
        after = after_out_of_memory(t.demand.memory_mib, event.observed_memory_mib,
                                    self.config.oom_growth, self._cluster.largest_memory_mib())
        gpu = self._cluster.gpu(t.node, t.gpu_index)
        if gpu is not None:
            # Future trials of this workload ask for the grown memory from the start.
            self._feedback(t.key, gpu.arch, after.memory_mib, 0.0, t.id,
                           oom_at=t.demand.memory_mib)
        if after.give_up:
            self._fail(t, after.reason, memory_override_mib=after.memory_mib)
        else:
            self._requeue(t, memory_override_mib=after.memory_mib, reason=after.reason)
        return self._schedule()

    def _group_oom(self, t: TrialRecord, event: TrialOutOfMemory) -> list[Command]:
        """A fused group ran out of memory: its width asks for more from now on (the
        group's memory grown; a width that no longer fits is not chosen), and the member
        runs again, alone or in another group, with no failure counted."""
        gpu = self._cluster.gpu(t.node, t.gpu_index)
        key = fusion.fused_key(t.key, t.group_width)
        first = t.group not in self._oom_groups
        self._oom_groups[t.group] = True
        if first and gpu is not None and (key, gpu.arch) in self._profiles:
            held = self._profiles[key, gpu.arch].demand.memory_mib
            grown = after_out_of_memory(held, event.observed_memory_mib, self.config.oom_growth,
                                        self._cluster.largest_memory_mib()).memory_mib
            self._feedback(key, gpu.arch, grown, 0.0, t.id, oom_at=held)
        self._release(t.id)
        self._requeue(t, reason=f"its fused group of {t.group_width} ran out of memory")
        return self._schedule()

    def _on_profile(self, event: ProfileMeasured) -> list[Command]:
        profile = event.profile
        slot = (profile.key, profile.arch)
        self._cluster.end_profile(slot)
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

    def known_slots(self, model: str, arch: str = "") -> list[Slot]:
        """What the history holds of a workload (profiles and failures), for forgetting."""
        return sorted((s for s in {*self._profiles, *self._profile_failed}
                       if s[0].model == model and (not arch or s[1] == arch)),
                      key=lambda s: (s[0].label(), s[1]))

    def _on_forgotten(self, event: ProfilesForgotten) -> list[Command]:
        """Forget what the history knows of a workload: its next study profiles it."""
        slots = self.known_slots(event.model, event.arch)
        if not slots:
            raise NotFound(f"the history has nothing of workload {_short(event.model, 80)!r}"
                           + (f" on {_short(event.arch, 40)}" if event.arch else ""))
        for slot in slots:
            if self._profiles.pop(slot, None) is not None:
                self._store.remove_profile(*slot)
            self._profile_failed.pop(slot, None)
        log.info("forgot %d profile(s) of %s", len(slots), event.model)
        return self._schedule()

    def _on_profile_failed(self, event: ProfileFailed) -> list[Command]:
        slot = (event.key, event.arch)
        self._cluster.end_profile(slot)
        self._profile_failed[slot] = event.reason
        log.warning("profiling %s on %s failed: %s", event.key.label(), event.arch, event.reason)
        return self._schedule()

    # ----------------------------------------------------------------- feedback
    def _observe(self, t: TrialRecord, gpu: Gpu, r: RunningTrial) -> None:
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
        """Record a trial's observed peaks in its profile (see `sampler.feedback`)."""
        p = self._profiles.get((key, arch))
        if p is None:
            return
        new = corrected(p, memory_mib, util_pct, trial_id, count=count, oom_at=oom_at,
                        margin=self.config.feedback_margin,
                        tolerance=self.config.feedback_compute_tolerance)
        if new is None:
            return
        self._profiles[key, arch] = new
        self._store.put_profile(new)
        if new.demand != p.demand:
            self._needs_cache.clear()
            self._profiling_dirty = True  # a fused width's memory guess may change

    # ----------------------------------------------------------------- state
    def _set(self, t: TrialRecord, **changes: Any) -> TrialRecord:
        if "state" in changes and changes["state"] != t.state:
            check_transition(t.id, t.state, changes["state"])
        new = t.model_copy(update=changes)
        was, now = t.state == TrialState.PENDING, new.state == TrialState.PENDING
        if was or now:
            old_group = self._group(t) if was else None
            new_group = self._group(new) if now else None
            if old_group != new_group:
                if was:
                    self._count_group(t, -1, old_group)
                if now:
                    self._count_group(new, 1, new_group)
        if new.state.terminal != t.state.terminal:
            self._open[t.study_id] += -1 if new.state.terminal else 1
        if t.state == TrialState.RUNNING and new.state != TrialState.RUNNING:
            self._last_step.pop(t.id, None)
            self._missing.pop(t.id, None)
        if (new.state == TrialState.PENDING) != (t.state == TrialState.PENDING):
            waiting = self._waiting_in(t.study_id)
            if new.state == TrialState.PENDING:
                waiting[t.id] = self._wait_order(new)
            else:
                del waiting[t.id]
        if (new.state == TrialState.PAUSED) != (t.state == TrialState.PAUSED):
            self._paused[t.study_id] = self._paused.get(t.study_id, 0) + (
                1 if new.state == TrialState.PAUSED else -1)
            ranked = self._rankings.get(t.study_id)
            if ranked is not None:
                if new.state == TrialState.PAUSED:
                    self._ranking(new, int(new.done_epochs)).paused.add(t.id)
                else:
                    self._ranking(t, int(t.done_epochs)).paused.discard(t.id)
        self._trials[t.id] = new
        self._dirty.add(t.id)
        if new.state.terminal and not t.state.terminal and t.study_id in self._searches:
            search = self._searches[t.study_id]
            if not search.stale:
                self._journal.touch(search)
                search.tell(new)
        return new

    def _count_group(self, t: TrialRecord, delta: int,
                     group: tuple[int, int | None, float] | None = None) -> None:
        counts = self._pending_groups.get(t.study_id)
        if counts is None:
            counts = self._pending_groups[t.study_id] = journaled(self._journal)
        group = group if group is not None else self._group(t)
        n = counts.get(group, 0) + delta
        if n > 0:
            counts[group] = n
        elif group in counts:
            del counts[group]

    def _wait_order(self, t: TrialRecord) -> int:
        """A pending trial's place in its study's queue: the study's order, except that
        a trial promoted past a rung comes before every trial of a lower rung (ASHA runs
        promotions first)."""
        return self._place.get(t.id, 0) - int(t.done_epochs) * _RUNG_ORDER

    def _waiting_in(self, study_id: str) -> JournaledDict[str, int]:
        waiting = self._waiting.get(study_id)
        if waiting is None:
            waiting = self._waiting[study_id] = journaled(self._journal)
        return waiting

    def _pending_of(self, study_id: str) -> list[TrialRecord]:
        """The study's PENDING trials, in the study's order."""
        waiting = self._waiting.get(study_id)
        if not waiting:
            return []
        return [self._trials[tid] for tid in sorted(waiting, key=waiting.__getitem__)]

    def _has_pending(self, study_id: str) -> bool:
        return bool(self._waiting.get(study_id))

    def _requeue(self, t: TrialRecord, **changes: Any) -> None:
        """Back to PENDING, holding no GPU."""
        self._set(t, state=TrialState.PENDING, **_HOLDS_NOTHING, **changes)

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
        if study.state != StudyState.ACTIVE or self._asks_left(study_id):
            return
        if self._open[study_id] and self._open[study_id] == self._paused.get(study_id, 0) \
                and not any(sid == study_id for sid, _ in self._windows):
            # Only paused trials left, none held for a window: the rankings are final.
            self._finish_rungs(study_id)
        if self._open[study_id] == 0:
            states = [self._trials[i].state for i in self._by_study[study_id]]
            # Every trial failed or diverged: the study failed, and says so.
            done = (StudyState.COMPLETED if TrialState.COMPLETED in states
                    else StudyState.FAILED)
            self._set_study(self._studies[study_id], done)
            log.info("study %s %s", study_id, done.value.lower())

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

    def _release(self, trial_id: str) -> None:
        """The trial gives back what it held; what it was seen using is fed back. A
        member of a fused group that goes on gives back its compute and cores, and its
        memory passes to a member still running: the group's process keeps the stacked
        parameters until it ends."""
        t = self._trials[trial_id]
        seen = self._observed.pop(trial_id, None)
        if seen is not None:
            self._feedback(t.key, seen[0], seen[1], seen[2], trial_id, count=True)
        self._cluster.release(trial_id, t.node, t.gpu_index, t.demand)
        if not t.group or t.group not in self._groups:
            return
        others = tuple(m for m in self._groups[t.group] if m != trial_id)
        if others:
            self._groups[t.group] = others
        else:
            del self._groups[t.group]
        heir = self._trials[others[0]] if others else None
        if heir is None or t.demand is None or heir.demand is None or \
                heir.state != TrialState.RUNNING or (heir.node, heir.gpu_index) != (
                    t.node, t.gpu_index):
            return
        node = self._cluster.get(heir.node)
        gpu = self._cluster.gpu(heir.node, heir.gpu_index)
        if node is None or gpu is None:
            return
        self._cluster.release(heir.id, heir.node, heir.gpu_index, heir.demand)
        demand = heir.demand.model_copy(
            update={"memory_mib": heir.demand.memory_mib + t.demand.memory_mib})
        self._cluster.allocate(heir.id, node, gpu, demand)
        self._set(heir, demand=demand)

    # ----------------------------------------------------------------- early stopping
    def _bracket(self, t: TrialRecord) -> int:
        space = self._spaces[t.study_id]
        if space.pruner is None:
            return 0
        return rungs.bracket_of(space.pruner, space.settings.epochs, self._place.get(t.id, 0))

    def _ladder(self, t: TrialRecord) -> tuple[int, ...]:
        """The rungs of a trial's bracket (none without a pruner)."""
        return self._bracket_ladder(t.study_id, self._bracket(t))

    def _bracket_ladder(self, study_id: str, bracket: int) -> tuple[int, ...]:
        ladder = self._ladders.get((study_id, bracket))
        if ladder is None:
            space = self._spaces[study_id]
            ladder = () if space.pruner is None else rungs.rungs(
                space.pruner, space.settings.epochs, bracket)
            self._ladders[study_id, bracket] = ladder
        return ladder

    def _ranking(self, t: TrialRecord, rung: int) -> rungs.Ranking:
        """The ranking at a rung of the trial's bracket."""
        by_rung = self._rankings_of(t.study_id)
        key = (self._bracket(t), rung)
        ranking = by_rung.get(key)
        if ranking is None:
            minimize = self._spaces[t.study_id].settings.objective.mode == "min"
            ranking = by_rung[key] = rungs.Ranking(minimize)
        return ranking

    def _rankings_of(self, study_id: str) -> dict[tuple[int, int], rungs.Ranking]:
        """A study's rankings, built from its trials' records when not cached."""
        by_rung = self._rankings.get(study_id)
        if by_rung is None:
            by_rung = self._rankings[study_id] = {}
            for tid in self._by_study[study_id]:
                t = self._trials[tid]
                for rung, value in t.rungs.items():
                    self._ranking(t, int(rung)).add(t.id, value)
                if t.state == TrialState.PAUSED:
                    self._ranking(t, int(t.done_epochs)).paused.add(t.id)
        return by_rung

    def _segment(self, t: TrialRecord) -> float:
        """The epochs a trial's next attempt runs: to its next rung where the pruner
        pauses trials, else to its end; from its checkpoint."""
        end = t.epochs
        if self._spaces[t.study_id].pause_mode():
            end = rungs.next_rung(self._ladder(t), t.done_epochs) or t.epochs
        return max(end - t.done_epochs, 0.0) or t.epochs

    def _at_rung(self, t: TrialRecord, event: TrialProgress) -> list[Command]:
        """A running trial reported an epoch: where it is a rung, keep the objective for
        the pruner and, unless the trial pauses there to be ranked, stop it now if it
        ranks too low."""
        space = self._spaces[t.study_id]
        pruner = space.pruner
        value = event.metrics.get(space.settings.objective.metric)
        step = event.step
        if pruner is not None and step > self._last_step.get(t.id, 0):
            self._last_step[t.id] = step
        if pruner is None or value is None or step in t.rungs or \
                len(t.rungs) >= MAX_RUNG_VALUES or step not in self._ladder(t):
            return []
        self._rankings_of(t.study_id)  # built before the new value is recorded
        t = self._set(t, rungs={**t.rungs, step: value})
        ranking = self._ranking(t, step)
        ranking.add(t.id, value)
        if pruner.type == "median":
            prune = ranking.median_prunes(t.id, value, pruner.min_trials)
        elif space.pause_mode() and t.stop_at == step:
            return []  # it stops here by itself, and is ranked then
        else:
            prune = not ranking.keeps(value, pruner.reduction_factor)
        if not prune:
            return []
        why = (f"pruned at epoch {step}: {space.settings.objective.metric} = {value:.6g} "
               f"ranks too low ({pruner.type})")
        return self._end_now(t, TrialState.PRUNED, why, event)

    def _paused_at_rung(self, t: TrialRecord, event: TrialFinished) -> bool:
        """A trial of a pausing pruner ended its attempt at its rung (with the rung's
        objective reported): it waits, PAUSED, to be promoted or pruned."""
        rung = t.stop_at
        last = self._last_step.pop(t.id, None)
        if rung is None or rung not in t.rungs or rung >= t.epochs or \
                (last is not None and last > rung):
            return False  # not at a rung, or it trained on past it (it ignores pauses)
        self._set(t, state=TrialState.PAUSED, **_HOLDS_NOTHING, done_epochs=float(rung),
                  stop_at=None, metrics=dict(event.metrics), log_tail=event.log_tail[-4000:],
                  reason=f"paused at rung {rung}")
        self._rung_decisions(t.study_id)
        self._maybe_done(t.study_id)
        return True

    def _rung_decisions(self, study_id: str) -> None:
        """ASHA's promotions: at each rung the best n // eta of the n trials ranked there go
        on (the paused ones among them resume); a paused trial that can never be among
        them, however the others do, is pruned now. Costs what is paused, not the
        study's size."""
        space = self._spaces[study_id]
        pruner = space.pruner
        if pruner is None or not self._paused.get(study_id) or \
                self._studies[study_id].state != StudyState.ACTIVE:
            for key in [k for k in self._windows if k[0] == study_id]:
                del self._windows[key]  # nothing left to promote
            return
        eta = pruner.reduction_factor
        epochs = space.settings.epochs
        count = rungs.brackets(pruner, epochs)
        now = self._clock.now()
        for (bracket, rung), ranking in sorted(self._rankings_of(study_id).items()):
            if not ranking.paused:
                continue
            ladder = self._bracket_ladder(study_id, bracket)
            index = ladder.index(rung) if rung in ladder else 0
            total = rungs.bracket_size(space.size(), count, bracket)
            go_on = rungs.promoted_count(len(ranking), eta)
            for tid in sorted(ranking.paused):
                t = self._trials[tid]
                rank = ranking.rank(tid, t.rungs[rung])
                if rank < go_on:
                    if self._held(study_id, rung, pruner.promotion_window_s, now):
                        continue
                    self._set(t, state=TrialState.PENDING,
                              reason=f"promoted at rung {rung} (ranked {rank + 1} of "
                                     f"{len(ranking)})")
                elif rungs.never_promoted(rank, total, eta, index):
                    self._prune_paused(t, f"pruned at rung {rung}: ranked {rank + 1} of "
                                          f"{len(ranking)}, outside the best 1/{eta}")
        # A window closes once it has passed (its promotions went) or nothing waits at
        # its rung any more: a window left open would keep the study from ending.
        waiting_at = {rung for (_, rung), r in self._rankings_of(study_id).items() if r.paused}
        for key in [k for k in self._windows if k[0] == study_id]:
            if self._windows[key] <= now or key[1] not in waiting_at:
                del self._windows[key]

    def _held(self, study_id: str, rung: int, window_s: float, now: float) -> bool:
        """Whether a rung's promotions wait for their window: the first opens it; once
        it has passed, every promotion of the rung goes (and a later one opens another)."""
        if window_s <= 0:
            return False
        due = self._windows.get((study_id, rung))
        if due is None:
            self._windows[study_id, rung] = now + window_s
            return True
        return now < due

    def _finish_rungs(self, study_id: str) -> None:
        """Nothing runs, waits or is left to ask, and trials are paused at rungs: in each
        bracket, the best trial at the highest rung goes on where none went further;
        otherwise the paused ones lost and are pruned."""
        space = self._spaces[study_id]
        minimize = space.settings.objective.mode == "min"
        by_bracket: dict[tuple[int, ...], list[TrialRecord]] = {}
        for tid in self._by_study[study_id]:
            t = self._trials[tid]
            by_bracket.setdefault(self._ladder(t), []).append(t)
        for members in by_bracket.values():
            paused = [t for t in members if t.state == TrialState.PAUSED]
            if not paused:
                continue
            top = max(t.done_epochs for t in paused)
            further = any(t.state == TrialState.COMPLETED or
                          any(r > top for r in t.rungs) for t in members)
            at_top = {t.id: t.rungs.get(int(top), math.inf if minimize else -math.inf)
                      for t in paused if t.done_epochs == top}
            best = None if further else rungs.ranked(at_top, minimize)[0]
            for t in paused:
                if t.id == best:
                    self._set(t, state=TrialState.PENDING,
                              reason=f"promoted at rung {int(top)}: the best there, and "
                                     "the search has nothing else to run")
                else:
                    self._prune_paused(t, f"pruned at rung {int(t.done_epochs)}: the search "
                                          "ended with better trials ahead of it")

    def _prune_paused(self, t: TrialRecord, why: str) -> None:
        self._set(t, state=TrialState.PRUNED, reason=why, finished_at=self._clock.now())
        if t.launched_on is not None:
            self._drops.append((t.id, t.launched_on))
        log.info("%s %s", t.id, why)

    # ----------------------------------------------------------------- adaptive search
    def _search(self, study_id: str) -> OptunaSearch:
        """A study's Optuna search, rebuilt from its trials where it is new or stale."""
        search = self._searches.get(study_id)
        if search is None:
            search = self._searches[study_id] = OptunaSearch(self._spaces[study_id])
        if search.stale:
            search.rebuild(self._trials[i] for i in self._by_study[study_id])
        return search

    def _asks_left(self, study_id: str) -> int:
        space = self._spaces[study_id]
        if not space.search.adaptive:
            return 0
        return space.size() - len(self._by_study[study_id])

    def _ask(self, active: list[StudyRecord], open_nodes: list[Node],
             archs: frozenset[str]) -> None:
        """Ask each Optuna search for as many new trials as the free capacity could hold
        beyond what the study already has waiting: a batch asked at once (the sampler
        sees the ones not yet told), none while the cluster is full."""
        for study in active:
            space = self._spaces[study.id]
            left = self._asks_left(study.id)
            if left <= 0 or space.search.type != "optuna":
                continue
            view = self._cluster.view(open_nodes, space.settings.oversubscription)
            gpus = view.gpus()
            if not gpus:
                continue
            per_gpu = sum(g.full_compute for g in gpus) / len(gpus)
            room = float(sum(g.compute for g in gpus))
            for t in self._pending_of(study.id):
                room -= self._least_compute(t, archs, per_gpu, space)
            asked: list[TrialRecord] = []
            search: OptunaSearch | None = None
            budget = self.config.ask_budget_s
            began = time.perf_counter()
            while room > 0 and len(asked) < min(left, 2 * len(gpus) + 1):
                if budget is not None and asked and time.perf_counter() - began > budget:
                    self._decide_again = True  # the rest at the next tick
                    break
                if search is None:
                    search = self._search(study.id)
                    self._journal.touch(search)
                number, params = search.ask()
                t = asked_trial(space, study.id, number, params)
                asked.append(t)
                room -= self._least_compute(t, archs, per_gpu, space)
            if asked:
                self._add_trials(study.id, asked)

    def _least_compute(self, t: TrialRecord, archs: frozenset[str], unknown: float,
                       space: SearchSpace) -> float:
        """The least scaled compute a trial needs on any architecture: from its profile,
        else from the demand the study states, else `unknown` (it will hold a GPU to be
        profiled)."""
        needs = self._needs(t, archs)
        if needs:
            return float(min(n.compute for n in needs.values()))
        computes = [Need.of(d.demand()).compute for d in map(space.settings.stated_on, archs)
                    if d is not None]
        return float(min(computes)) if computes else unknown

    def _add_trials(self, study_id: str, trials: list[TrialRecord]) -> None:
        self._store.add_trials(trials)
        ids = self._by_study[study_id]
        self._by_study[study_id] = [*ids, *(t.id for t in trials)]
        self._open[study_id] += len(trials)
        waiting = self._waiting_in(study_id)
        for i, t in enumerate(trials, start=len(ids)):
            self._trials[t.id] = t
            self._place[t.id] = i
            waiting[t.id] = self._wait_order(t)
            self._count_group(t, 1)
        self._profiling_dirty = True  # a new workload key may want a profile
        log.info("study %s: %d new trial(s), %d of %d", study_id, len(trials),
                 len(self._by_study[study_id]), self._spaces[study_id].size())

    # ----------------------------------------------------------------- decisions
    def _policy(self, space: SearchSpace) -> Policy:
        name = self.config.policy or space.settings.policy
        if name not in self._policies:
            self._policies[name] = make_policy(name, **self.config.policy_options.get(name, {}))
        return self._policies[name]

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
        """Decide for every active study, in the order `shares` gives: priorities first,
        then each study up to its fair share, most under-served first, then what is left;
        then preemption for the studies that ask for it."""
        if self._deferred:
            self._schedule_wanted = True
            return []
        self._schedule_wanted = False
        self._decide_again = False
        commands: list[Command] = []
        open_nodes = self._cluster.open_nodes()
        archs = frozenset().union(*[n.archs() for n in open_nodes])
        active = [s for s in self.studies() if s.state == StudyState.ACTIVE]
        if open_nodes:
            self._ask(active, open_nodes, archs)
        if self._profiling_dirty or self._profiling_waiting:
            commands += self._profile_missing(active, open_nodes, archs)
            self._profiling_dirty = False
        if not active or not open_nodes:
            return commands
        claims, quotas = self._claims(active)
        cycle = CycleState(claims, quotas)
        capacity = float(sum(len(n.gpus) for n in open_nodes))
        above = 0.0  # what studies of higher priority hold
        reserved = cycle.reserved

        def decide(c: shares.Claim, room: float | None) -> bool:
            return self._decide_guarded(c, open_nodes, archs, room, cycle, commands)

        for level in shares.levels(claims):
            fair = shares.targets(level, capacity - above, self._user_weight)
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
                        self._reserve(c, math.inf, open_nodes, reserved)
                    continue
                room = fair.get(c.study_id, 0.0) - c.used
                if room <= shares.EPS or decide(c, room):
                    again.append(c)
                else:
                    self._reserve(c, fair.get(c.study_id, 0.0) - c.used, open_nodes, reserved)
            for c in again:
                if c.pending:
                    decide(c, None)
            above += sum(c.used for c in level)
        commands += self._preempt(cycle, open_nodes, archs)
        return commands

    def _reserve(self, claim: shares.Claim, budget: float, open_nodes: list[Node],
                 reserved: dict[tuple[str, int], str]) -> None:
        """Reserve, for each of the study's trials that found no room (largest first, up
        to `budget` GPU-equivalents), the unreserved GPU closest to fitting it."""
        ratios = self._spaces[claim.study_id].settings.oversubscription
        for item in sorted(claim.unfit, key=lambda it: (-it.value, it.id))[:MAX_RESERVED]:
            if budget <= shares.EPS:
                return
            best: tuple[float, tuple[str, int], str] | None = None
            for node in open_nodes:
                for idx, gpu in node.gpus.items():
                    need = item.needs.get(gpu.arch)
                    units = self._gpu_units(gpu.arch)
                    if need is None or (node.name, idx) in reserved or units <= 0 or \
                            need.memory > gpu.memory_mib or gpu.profiling is not None or \
                            need.compute > compute_capacity(self.config.ratio(gpu.arch,
                                                                              ratios)):
                        continue
                    free = (units - gpu.used_compute) / units \
                        + (gpu.memory_mib - gpu.used_memory) / max(1, gpu.memory_mib)
                    if best is None or free > best[0]:
                        best = (free, (node.name, idx), gpu.arch)
            if best is None:
                return
            _, where, arch = best
            reserved[where] = claim.study_id
            budget -= self._cost(item.needs[arch].compute, arch)

    def _user_weight(self, user: str) -> float:
        return self.config.share_rule(user).weight

    def _gpu_units(self, arch: str) -> int:
        """One GPU's scaled compute at the server's ratio: the unit of shares."""
        return compute_capacity(self.config.ratio(arch, {}))

    def _cost(self, compute: int, arch: str) -> float:
        """What holding `compute` units on a GPU of `arch` counts in a share."""
        return shares.share_of(compute, self._gpu_units(arch))

    def _claims(self, active: list[StudyRecord]
                ) -> tuple[list[shares.Claim], dict[str, shares.Quota]]:
        """Each active study's standing (what it holds, whether it waits) and each of
        their users' quota left."""
        claims: dict[str, shares.Claim] = {}
        rule = self.config.share_rule(active[0].owner)
        if len(active) == 1 and rule.max_gpus is None and rule.max_compute is None:
            # Alone and without a quota: what it holds changes nothing (its decision
            # finds out whether anything waits).
            s = active[0]
            settings = self._spaces[s.id].settings
            return ([shares.Claim(s.id, s.owner, settings.priority, settings.weight, s.seq,
                                  pending=True)],
                    {s.owner: shares.Quota()})
        for s in active:
            settings = self._spaces[s.id].settings
            claims[s.id] = shares.Claim(s.id, s.owner, settings.priority, settings.weight,
                                        s.seq)
        used: dict[str, float] = {}
        held: dict[str, set[tuple[str, int]]] = {}
        for node in self._cluster:
            for idx, gpu in node.gpus.items():
                for tid in gpu.trials:
                    t = self._trials[tid]
                    c = claims.get(t.study_id)
                    if c is None or t.demand is None:
                        continue
                    cost = self._cost(Need.of(t.demand).compute, gpu.arch)
                    c.used += cost
                    used[c.user] = used.get(c.user, 0.0) + cost
                    held.setdefault(c.user, set()).add((node.name, idx))
        for c in claims.values():
            c.pending = self._has_pending(c.study_id)
        quotas = {u: shares.quota_left(self.config.share_rule(u), used.get(u, 0.0),
                                       held.get(u, set()))
                  for u in {c.user for c in claims.values()}}
        return list(claims.values()), quotas

    def _decide_guarded(self, claim: shares.Claim, open_nodes: list[Node],
                        archs: frozenset[str], room: float | None, cycle: CycleState,
                        commands: list[Command]) -> bool:
        """One study's decision; one study's failed decision is undone (in memory, in the
        store and in the cycle) and leaves the others to theirs. True when its share
        (`room`) stopped it short."""
        closed = cycle.closed_to(claim.study_id)
        try:
            with cycle.attempt(claim) as (mine, quota), self._undone_if_raises():
                out, cut = self._decide(mine, open_nodes, archs, room, quota, closed)
        except Exception as exc:
            if self._store.failed(exc):
                raise
            self._decide_again = True
            if isinstance(exc, PlanError):  # a policy's bug (a plug-in's, say), not ours
                log.error("policy %r returned a plan for study %s that breaks an invariant "
                          "(%s); nothing of it was launched, and the decision is tried "
                          "again at the next event",
                          self._policy(self._spaces[claim.study_id]).name, claim.study_id,
                          exc)
            else:
                log.exception("the decision for study %s failed and was undone; it is "
                              "tried again at the next event", claim.study_id)
            return False
        commands += out
        return cut

    def _decide(self, claim: shares.Claim, open_nodes: list[Node], archs: frozenset[str],
                room: float | None, quota: shares.Quota, closed: set[tuple[str, int]]
                ) -> tuple[list[Command], bool]:
        """One policy run for one study's pending trials (and, where fused groups did not
        fit, further runs for their halves on what is left). Placements past the study's
        share (`room`, GPU-equivalents; None: no bound) or its user's quota wait. Returns
        the launches and whether the share stopped them short. `closed`: GPUs reserved
        for other studies, where it places nothing."""
        space = self._spaces[claim.study_id]
        view = _closed(self._cluster.view(open_nodes, space.settings.oversubscription), closed)
        pending = self._pending_of(claim.study_id)
        if not pending:
            claim.pending = False
            return [], False
        fused: dict[str, _Fused] = {}
        alone = pending
        if self._fusion(space):
            fused, alone = self._fused_items(space, pending, archs, view)
        batch = [f.item for f in fused.values()] + self._plain_items(alone, archs, view)
        commands: list[Command] = []
        policy = self._policy(space)
        cut = False
        unfit: list[Item] = []
        while batch:
            plan = policy.place(batch, view)
            check_plan(batch, view, plan)  # no plan over a capacity is ever launched
            self.decisions.append(Decision(self._clock.now(), claim.study_id, policy.name,
                                           len(batch), len(plan.placements),
                                           plan.solve_time_s, plan, view, tuple(batch)))
            by_id = {it.id: it for it in batch}
            taken: list[Placement] = []
            for p in plan.placements:
                gpu = self._cluster.live(p.node).gpus[p.gpu_index]
                cost = self._cost(by_id[p.item_id].needs[gpu.arch].compute, gpu.arch)
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
                    commands.append(self._launch(self._trials[p.item_id], p.node, p.gpu_index))
                else:
                    commands.append(self._launch_group(f.members, p.node, p.gpu_index))
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
                        batch += self._plain_items(chunk, archs, view)
                    else:
                        g = _Fused(chunk, f.widths, f.run_times, f.single_value)
                        fused[g.item.id] = g
                        batch.append(g.item)
        claim.pending = self._has_pending(claim.study_id)
        # Waiting for room: what is pending did not fit now but fits an empty GPU.
        claim.unfit = [it for it in unfit if _fits_empty(it, view)] \
            if claim.pending and not cut else []
        return commands, cut

    # ----------------------------------------------------------------- preemption
    def _preempt(self, cycle: CycleState, open_nodes: list[Node], archs: frozenset[str]
                 ) -> list[Command]:
        """For each study with `preempt: true` that still waits, highest priority first:
        stop trials of lower-priority studies where that lets its trials fit."""
        commands: list[Command] = []
        priority = {c.study_id: c.priority for c in cycle.claims}
        for c in sorted(cycle.claims, key=lambda c: (-c.priority, c.seq)):
            if not (c.pending and self._spaces[c.study_id].settings.preempt):
                continue
            victims = {tid: self._trials[tid] for node in open_nodes
                       for gpu in node.gpus.values() for tid in gpu.trials
                       if priority.get(self._trials[tid].study_id, c.priority) < c.priority}
            if not victims:
                continue
            try:
                with cycle.attempt(c) as (mine, quota), self._undone_if_raises():
                    commands += self._make_room(mine, victims, priority, open_nodes, archs,
                                                quota)
            except Exception as exc:
                if self._store.failed(exc):
                    raise
                self._decide_again = True
                log.exception("preempting for study %s failed and was undone", c.study_id)
        return commands

    def _make_room(self, claim: shares.Claim, victims: dict[str, TrialRecord],
                   priority: Mapping[str, int], open_nodes: list[Node],
                   archs: frozenset[str], quota: shares.Quota) -> list[Command]:
        """Place the study's waiting trials (alone, not fused), largest first, each on the
        GPU where it needs the fewest of the victims stopped (none where it fits now),
        then where those lose the least work; on that GPU stop just those (lowest
        priority first, then the latest started)."""
        space = self._spaces[claim.study_id]
        ratios = space.settings.oversubscription
        view = _freed(self._cluster.view(open_nodes, ratios), victims)
        pending = self._pending_of(claim.study_id)
        batch = self._plain_items(pending, archs, view)
        if not batch:
            return []
        now = self._clock.now()
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
                            (node.spec.name, idx), self._cost(need.compute, gpu.arch)):
                        continue
                    cap = compute_capacity(self.config.ratio(gpu.arch, ratios))
                    chosen = self._stops_for(node, gpu, need, cap, victims, priority)
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
                for member in self._with_group(victim):
                    if victims.pop(member.id, None) is not None:
                        stops.append(self._stop(member, why))
            gpu = node.gpus[idx]
            need = item.needs[gpu.arch]
            if not self._fits(node, gpu, need,
                              compute_capacity(self.config.ratio(gpu.arch, ratios))):
                continue  # a fused group's memory stays held until its process ends
            cost = self._cost(need.compute, gpu.arch)
            quota.take((node.spec.name, idx), cost)
            claim.used += cost
            launches.append(self._launch(self._trials[item.id], node.spec.name, idx))
        if stops:
            log.info("study %s: stopped %d trial(s) of lower priority to launch %d",
                     claim.study_id, len(stops), len(launches))
        claim.pending = self._has_pending(claim.study_id)
        return stops + launches  # the stops first: the agent frees the GPU, then launches

    def _stops_for(self, node: Node, gpu: Gpu, need: Need, cap: int,
                   victims: Mapping[str, TrialRecord], priority: Mapping[str, int]
                   ) -> list[TrialRecord] | None:
        """The victims to stop, in `_victim`'s order, for `need` to fit on `gpu` (none:
        it fits now); None where stopping every victim there would not do."""
        if gpu.profiling is not None or gpu.reserved_for is not None:
            return None
        compute, memory, cores = gpu.used_compute, gpu.used_memory, node.used_cores
        on_gpu = len(gpu.trials)
        full_cores = core_units(node.spec.cores)
        chosen: list[TrialRecord] = []
        taken: set[str] = set()  # chosen already (no copy of every victim per GPU tried)

        def short_on_gpu() -> bool:
            return (compute + need.compute > cap or memory + need.memory > gpu.memory_mib
                    or (self.config.exclusive and on_gpu > 0))

        while short_on_gpu() or cores + need.cores > full_cores:
            victim = _victim(node, gpu, short_on_gpu(), victims, priority, taken)
            if victim is None or victim.demand is None:
                return None
            taken.add(victim.id)
            chosen.append(victim)
            held = Need.of(victim.demand)
            if victim.gpu_index == gpu.spec_index:
                compute -= held.compute
                memory -= held.memory
                on_gpu -= 1
            cores -= held.cores
        return chosen

    def _gpu_fits(self, gpu: Gpu, need: Need, cap: int) -> bool:
        """Whether the GPU itself takes the need now (`cap`: its scaled compute)."""
        return (gpu.profiling is None and gpu.reserved_for is None
                and not (self.config.exclusive and gpu.trials)
                and gpu.used_compute + need.compute <= cap
                and gpu.used_memory + need.memory <= gpu.memory_mib)

    def _fits(self, node: Node, gpu: Gpu, need: Need, cap: int) -> bool:
        return self._gpu_fits(gpu, need, cap) and \
            node.used_cores + need.cores <= core_units(node.spec.cores)

    def _with_group(self, t: TrialRecord) -> list[TrialRecord]:
        """A trial and the other members of its fused group: a group stops whole (its
        process holds the stacked memory until it ends)."""
        if not t.group or t.group not in self._groups:
            return [t]
        return [self._trials[m] for m in self._groups[t.group]]

    def _stop(self, t: TrialRecord, why: str) -> KillTrial:
        """Stop a running trial and put it back to wait, with no failure counted. Its
        attempt's exit, when it comes, is stale: the trial no longer names that node."""
        assert t.node is not None
        kill = KillTrial(t.id, t.node, why, attempt=t.launches)
        self._release(t.id)
        self._requeue(self._trials[t.id], launched_on=None, reason=why)
        log.info("%s %s", t.id, why)
        return kill

    def _fusion(self, space: SearchSpace) -> bool:
        return self.config.fusion and not self.config.exclusive and fusion.enabled(space)

    def _plain_items(self, trials: list[TrialRecord], archs: frozenset[str],
                     view: ClusterView) -> list[Item]:
        """Trials alone. Trials with equal needs are interchangeable: once one fails to
        fit, so do the rest. Each group passes only as many as could fit in the free
        compute, plus one, so a decision costs what is placeable, not what is pending;
        the scan stops once every group the study may have waiting has passed its
        share (with 10,000 pending, most decisions look at a few dozen)."""
        batch: list[Item] = []
        if not trials:
            return batch
        # Exact counts of the study's pending trials per group: a group is done once it
        # passed its share or its last pending trial was seen.
        waiting = self._pending_groups.get(trials[0].study_id)
        open_groups = len(waiting) if waiting is not None else -1
        fits = _FitBounds(view)
        groups: dict[tuple[int, int | None, float], _Scan] = {}
        for t in trials:
            group = self._group(t)
            g = groups.get(group)
            if g is None:
                needs = self._needs(t, archs)
                epochs = self._segment(t)
                times = {a: self._profiles[t.key, a].run_time_s(epochs) for a in needs}
                run_time = max(times.values(), default=0.0)
                speed = ({a: run_time / s for a, s in times.items() if s > 0}
                         if len(times) > 1 and run_time > 0 else {})
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

    def _group(self, t: TrialRecord) -> tuple[int, int | None, float]:
        """Trials of one group are interchangeable for placement: one workload, one
        memory correction, one length."""
        return (self._key_number(t), t.memory_override_mib, self._segment(t))

    def _key_number(self, t: TrialRecord) -> int:
        """A small number per workload key, kept per trial: comparing keys themselves
        (pydantic models) is most of what grouping thousands of trials costs."""
        number = self._key_of_trial.get(t.id)
        if number is None:
            number = self._key_numbers.setdefault(t.key, len(self._key_numbers))
            self._key_of_trial[t.id] = number
        return number

    def _fused_items(self, space: SearchSpace, pending: list[TrialRecord],
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
                classes.setdefault((c, t.done_epochs, self._segment(t)), []).append(t)
        gpus: dict[str, tuple[float, int]] = {}  # arch -> scaled capacity %, memory MiB
        for node in view.nodes:
            for g in node.gpus:
                cap = self.config.ratio(g.arch, space.settings.oversubscription) * 100.0
                gpus[g.arch] = (cap, max(g.full_memory, gpus.get(g.arch, (0.0, 0))[1]))
        fused: dict[str, _Fused] = {}
        fits = _FitBounds(view)
        for ((key, _, _), _, segment), members in classes.items():
            widths: dict[int, dict[str, Need]] = {}
            run_times: dict[int, float] = {}
            for w in fusion.candidate_widths(space.settings.max_fusion_width, len(members)):
                needs = {}
                for arch in sorted(archs & gpus.keys()):
                    single = self._profiles.get((key, arch))
                    wide = self._profiles.get((fusion.fused_key(key, w), arch))
                    if single is not None and wide is not None and \
                            fusion.useful(single, wide, *gpus[arch]):
                        needs[arch] = Need.of(wide.demand)
                        run_times[w] = max(run_times.get(w, 0.0), wide.run_time_s(segment))
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
                               default_value(self._needs(members[0], archs)))
                    fused[f.item.id] = f
        return fused, alone

    def _launch(self, t: TrialRecord, node_name: str, gpu_index: int,
                demand: Demand | None = None, group: str = "", width: int = 0
                ) -> LaunchTrial:
        """A trial's next attempt on that GPU, holding its profile's demand (a member of
        a fused group: its share of the group's, given)."""
        node = self._cluster.live(node_name)
        gpu = node.gpus[gpu_index]
        if demand is None:
            demand = demand_with_override(self._profiles[t.key, gpu.arch],
                                          t.memory_override_mib)
        stop_at = None
        if self._spaces[t.study_id].pause_mode():
            stop_at = rungs.next_rung(self._ladder(t), t.done_epochs)
        t = self._set(t, state=TrialState.RUNNING, node=node_name, gpu_index=gpu_index,
                      launched_on=node_name, demand=demand, launches=t.launches + 1,
                      started_at=t.started_at if t.done_epochs else self._clock.now(),
                      group=group, group_width=width, stop_at=stop_at)
        self._cluster.allocate(t.id, node, gpu, demand)
        return LaunchTrial(trial_id=t.id, study_id=t.study_id, node=node_name,
                           gpu_index=gpu_index, params=dict(t.params), key=t.key,
                           demand=demand, epochs=t.epochs, attempt=t.launches,
                           stop_at=stop_at or 0.0, done_epochs=t.done_epochs)

    def _launch_group(self, members: list[TrialRecord], node_name: str, gpu_index: int
                      ) -> LaunchGroup:
        """One process for a fused group; each member holds its share of the group's
        demand and runs (and ends) as its own trial."""
        gpu = self._cluster.live(node_name).gpus[gpu_index]
        width = len(members)
        key = fusion.fused_key(members[0].key, width)
        demand = self._profiles[key, gpu.arch].demand
        share = fusion.member_share(demand, width)
        group_id = f"{members[0].id}.k{width}.a{members[0].launches + 1}"
        launches = [self._launch(t, node_name, gpu_index, share, group_id, width)
                    for t in members]
        self._groups[group_id] = tuple(t.id for t in members)
        return LaunchGroup(group_id=group_id, node=node_name, gpu_index=gpu_index, key=key,
                           demand=demand, members=tuple(launches))

    def _state_demands(self, active: list[StudyRecord], archs: frozenset[str]) -> None:
        """A study that states its demand (`settings.demand`) needs no profile run: its
        workloads get profiles from it, on every architecture it names (or all). Written
        to the history like a measurement, with its source; a measured profile gives way,
        another study's stated one does not."""
        for study in active:
            settings = self._spaces[study.id].settings
            if settings.demand is None:
                continue
            keys = {self._trials[tid].key for tid in self._by_study[study.id]}
            for arch in sorted(archs):
                d = settings.stated_on(arch)
                if d is None:
                    continue
                for key in keys:
                    old = self._profiles.get((key, arch))
                    if old is not None and old.source.startswith("stated"):
                        continue
                    p = Profile(key=key, arch=arch, demand=d.demand(),
                                iter_time_s=d.epoch_s, iters_per_epoch=1,
                                source=f"stated by study {study.id}")
                    self._profiles[key, arch] = p
                    self._profile_failed.pop((key, arch), None)
                    self._store.put_profile(p)
                    self._needs_cache.clear()  # it may hold "no profile yet" for the key

    def _fused_profiles_wanted(self, active: list[StudyRecord], open_nodes: list[Node],
                               archs: frozenset[str]) -> list[Slot]:
        """The fused widths to measure next: per workload and architecture with a profile
        alone, the narrowest width not yet measured (2, 4, 8, ... up to the study's limit
        and its pending trials of that workload), one at a time, and none past a width
        that failed or that the memory fit so far (a + b*K) says no GPU holds."""
        largest: dict[str, int] = {}
        for node in open_nodes:
            for g in node.gpus.values():
                largest[g.arch] = max(largest.get(g.arch, 0), g.memory_mib)
        out: list[Slot] = []
        for study in active:
            space = self._spaces[study.id]
            if not self._fusion(space):
                continue
            counts: dict[WorkloadKey, int] = {}
            for t in self._pending_of(study.id):
                if fusion.class_of(t) is not None:
                    counts[t.key] = counts.get(t.key, 0) + 1
            for key, n in counts.items():
                widths = fusion.candidate_widths(space.settings.max_fusion_width, n)
                for arch in sorted(archs):
                    if (key, arch) not in self._profiles:
                        continue
                    for w in widths:
                        slot = (fusion.fused_key(key, w), arch)
                        if slot in self._profiles:
                            continue
                        guess = fusion.predicted_memory_mib(self._profiles, key, arch, w)
                        if slot not in self._profile_failed and (
                                guess is None or guess <= largest.get(arch, 0)):
                            out.append(slot)
                        break
        return out

    def _profile_missing(self, active: list[StudyRecord], open_nodes: list[Node],
                         archs: frozenset[str]) -> list[Command]:
        """Profile each (workload, architecture) the history lacks, on a GPU of that
        architecture (see `sampler.planning`); move trials between PENDING and PROFILING;
        fail those no architecture can run."""
        if not archs:
            return []
        self._state_demands(active, archs)
        in_flight = self._cluster.in_flight()
        wanted: list[Slot] = []
        for study in active:
            for tid in self._by_study[study.id]:
                t = self._trials[tid]
                if t.state not in (TrialState.PENDING, TrialState.PROFILING):
                    continue
                for slot in planning.missing(t.key, archs, self._profiles, self._profile_failed):
                    if slot not in in_flight and slot not in wanted:
                        wanted.append(slot)
                status = planning.status(t.key, archs, self._profiles, self._profile_failed)
                if status == "known":
                    if t.state == TrialState.PROFILING:
                        self._set(t, state=TrialState.PENDING)
                elif status == "failed":
                    reasons = "; ".join(f"{a}: {self._profile_failed[t.key, a]}"
                                        for a in sorted(archs))
                    self._fail(t, f"profiling failed on every architecture ({reasons})")
                elif t.state == TrialState.PENDING:
                    self._set(t, state=TrialState.PROFILING)
        wanted += [s for s in self._fused_profiles_wanted(active, open_nodes, archs)
                   if s not in in_flight and s not in wanted]
        plan = planning.plan_profiles(wanted, self._cluster.gpu_slots(open_nodes))
        for slot, g in plan.reserve:
            node = self._cluster.live(g.node)
            self._cluster.reserve(node, node.gpus[g.index], slot)
        commands: list[Command] = []
        for slot, g in plan.start:
            node = self._cluster.live(g.node)
            self._cluster.start_profile(node, node.gpus[g.index], slot)
            commands.append(ProfileWorkload(key=slot[0], arch=slot[1], node=node.name,
                                            gpu_index=g.index,
                                            iterations=self.config.profile_iterations,
                                            warmup=self.config.profile_warmup))
        # Run again at the next exit while a wanted profile found no GPU or a reserved
        # GPU has yet to drain.
        assigned = {slot for slot, _ in (*plan.start, *plan.reserve)}
        self._profiling_waiting = any(s not in assigned for s in wanted) or any(
            g.reserved_for is not None for n in open_nodes for g in n.gpus.values())
        return commands


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
    run_times: dict[int, float]
    single_value: int  # one member's value alone: the group's is its members' work

    @property
    def item(self) -> Item:
        w = len(self.members)
        return Item(f"fused:{self.members[0].id}", self.widths[w], self.run_times[w],
                    value=self.single_value * w)


# Events after which profile bookkeeping has nothing new to see (a trial's exit frees a
# GPU, which matters to it only while `_profiling_waiting`).
_ROUTINE = (TrialProgress, TrialStarted, Heartbeat, TrialFinished, TrialFailed, Tick, Wake)

E = TypeVar("E")


def _handler(kind: type[E], fn: Callable[[E], list[Command]]
             ) -> tuple[type, Callable[[Any], list[Command]]]:
    """One entry of the dispatch table, type-checked: `fn` takes events of `kind`."""
    return kind, fn


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class _FitBounds:
    """Upper bounds on how many items of given needs fit in one view (`bound`, plus
    one). Each architecture's GPUs are sorted by free compute, most first, so a need
    stops at the first GPU too full for one item (those add nothing to the sum) instead
    of walking every GPU of the cluster."""

    def __init__(self, view: ClusterView) -> None:
        self._free: dict[str, list[tuple[int, int]]] = {}
        for node in view.nodes:
            for gpu in node.gpus:
                self._free.setdefault(gpu.arch, []).append((gpu.compute, gpu.memory))
        for gpus in self._free.values():
            gpus.sort(reverse=True)

    def bound(self, needs: Mapping[str, Need]) -> int:
        total = 0
        big = 1 << 30
        for arch, need in needs.items():
            gpus = self._free.get(arch)
            if not gpus:
                continue
            if need.compute <= 0 and need.memory <= 0:
                return big
            for compute, memory in gpus:
                if need.compute > 0:
                    if compute < need.compute:
                        break  # sorted: no GPU after this holds one
                    by_compute = compute // need.compute
                else:
                    by_compute = big
                total += min(by_compute, memory // need.memory if need.memory > 0 else big)
        return total + 1


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


def _fits_empty(item: Item, view: ClusterView) -> bool:
    """Whether the item fits some GPU of the view once that GPU and its node are empty."""
    for node in view.nodes:
        for g in node.gpus:
            need = item.needs.get(g.arch)
            if need is not None and need.compute <= g.full_compute and \
                    need.memory <= g.full_memory and need.cores <= node.full_cores:
                return True
    return False


def _closed(view: ClusterView, closed: set[tuple[str, int]]) -> ClusterView:
    """The view with these GPUs taking nothing new."""
    if not closed:
        return view
    return ClusterView(nodes=tuple(
        replace(n, gpus=tuple(replace(g, slots=0) if (n.name, g.index) in closed else g
                              for g in n.gpus))
        for n in view.nodes))
