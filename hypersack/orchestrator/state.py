"""The one state of the core, which every phase reads and changes: studies, trials and
their indexes, the cluster, profiles, rungs, searches, the decision log, and the caches
derived from them.

Every mutable container is journaled (a refused event, or a batch the store undid,
changes none of them) or is a cache whose invalidation is registered with the journal
(`forget_caches`). The modules of the core (book, pruning, profiling, searches,
membership, decide, preempt, explain, trials, studies) each own one responsibility over
it; the runtime (`orchestrator`) owns the event table and the order of a decision
cycle's phases.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from hypersack.core.clock import Clock
from hypersack.core.types import (
    Profile,
    Span,
    StudyRecord,
    TrialRecord,
    TrialState,
    WorkloadKey,
)
from hypersack.grid import rungs
from hypersack.grid.adaptive import OptunaSearch
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator import fusion
from hypersack.orchestrator.cluster import ClusterState, Node
from hypersack.orchestrator.commands import Command
from hypersack.orchestrator.config import OrchestratorConfig
from hypersack.orchestrator.journal import (
    Journal,
    JournaledDict,
    JournaledLog,
    OrderedJournaledDict,
    journaled,
)
from hypersack.policies.base import ClusterView, Item, Need, Plan, Policy
from hypersack.sampler.planning import Slot
from hypersack.store.base import Store

RUNG_ORDER = 10_000_000  # more than a study's trials: promoted trials wait first
# A trial that waits (PENDING, PAUSED) holds no GPU and is in no fused group.
HOLDS_NOTHING: dict[str, Any] = {"node": None, "gpu_index": None, "demand": None,
                                 "group": "", "group_width": 0}


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


class CoreState:
    def __init__(self, store: Store, clock: Clock, config: OrchestratorConfig) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.policies: dict[str, Policy] = {}  # by name: made once
        j = self.journal = Journal()
        self.studies: dict[str, StudyRecord] = journaled(j)
        self.spaces: dict[str, SearchSpace] = journaled(j)
        self.trials: dict[str, TrialRecord] = journaled(j)
        self.by_study: dict[str, list[str]] = journaled(j)
        self.open: dict[str, int] = journaled(j)  # trials not yet terminal, per study
        # PENDING trials per study (trial id -> its place in the study), so a decision
        # costs what waits, not the study's size.
        self.waiting: dict[str, OrderedJournaledDict[str]] = journaled(j)
        # Per study, how many PENDING trials each workload group (see Book.group) has:
        # a decision stops scanning once every group waiting has passed what could fit.
        self.pending_groups: dict[str, JournaledDict[tuple[int, int | None, float], int]] = \
            journaled(j)
        self.place: dict[str, int] = journaled(j)  # trial id -> its place in its study
        # Caches. A small number per workload key (append-only: a key keeps its number, so
        # the journaled group counts stay valid), and each trial's, invalidated by any
        # rollback (an undone submission's trial ids come back with other keys).
        self.key_numbers: dict[WorkloadKey, int] = {}
        self.key_of_trial: dict[str, int] = {}
        # The live config's ratios (set_ratios replaces the config).
        self.cluster = ClusterState(j, lambda arch, ratios: self.config.ratio(arch, ratios),
                                    config.exclusive)
        self.profiles: dict[Slot, Profile] = journaled(j)
        self.profile_failed: dict[Slot, str] = journaled(j)
        # The waiting trial whose parameters each running profile job uses, and the
        # trials whose profile runs failed, per slot (see Profiling.on_profile_failed).
        self.profile_sample: dict[Slot, str] = journaled(j)
        self.profile_tried: dict[Slot, tuple[str, ...]] = journaled(j)
        # trial: arch, peak MiB, peak %
        self.observed: dict[str, tuple[str, int, float]] = journaled(j)
        # When each running trial's current attempt was launched (its span's start).
        self.launched_at: dict[str, float] = journaled(j)
        # fused group -> its members still running
        self.groups: dict[str, tuple[str, ...]] = journaled(j)
        self.oom_groups: dict[str, bool] = journaled(j)  # groups whose OOM was counted
        self.paused: dict[str, int] = journaled(j)  # PAUSED trials per study
        # Trials per (study, state): a study's counts without a walk over its trials
        # (a client watching a study of 50,000 asked for them twice a second).
        self.state_counts: dict[tuple[str, TrialState], int] = journaled(j)
        # (study, rung) -> when the rung's promotions held for its window resume
        self.windows: dict[tuple[str, int], float] = journaled(j)
        # Trials pruned while handling the current event, and the node of their
        # checkpoint: DropCheckpoint commands once the event's handling stands.
        self.drops: list[tuple[str, str]] = []
        # Exits handled in the current event, by trial: the attempt's mark as handled
        # (TrialRecord.exited) goes with the trial's next change (Book.set), or alone at
        # the event's end (Book.settle_marks). A change of its own before the handler's
        # was a tenth of an exit's cost at a thousand nodes.
        self.exit_marks: dict[str, int] = {}
        # Studies with an Optuna search: their Optuna study, saved whole by the journal
        # (an undone event leaves it stale, and it is rebuilt from the trial records).
        self.searches: dict[str, OptunaSearch] = journaled(j)
        # Caches: each bracket's rungs, and per study the rankings at each (bracket,
        # rung), built from the trial records when first needed.
        self.ladders: dict[tuple[str, int], tuple[int, ...]] = {}
        self.rankings: dict[str, dict[tuple[int, int], rungs.Ranking]] = {}
        # The last epoch each running trial of a pruned study reported (not kept across a
        # restart): a trial that ran past the rung it was to pause at did not pause.
        self.last_step: dict[str, int] = journaled(j)
        # Running trials a live node's heartbeats leave out, and since when (not kept
        # across a restart: a restarted server counts afresh).
        self.missing: dict[str, float] = journaled(j)
        self.needs_cache: dict[tuple[WorkloadKey, int | None, frozenset[str]],
                               dict[str, Need]] = {}
        self.dirty: set[str] = set()  # trials to write at the end of the batch
        # Spans of attempts that ended in this batch, written with it (Book.flush).
        self.spans: dict[tuple[str, int], Span] = journaled(j)
        self.dirty_studies: set[str] = set()
        # The recent policy runs, how many there were and their solve time: an undone
        # decision is neither kept nor counted (`plan` and /metrics read them as fact).
        self.decisions: JournaledLog[Decision] = JournaledLog(
            j, config.decision_log, lambda d: d.solve_time_s)
        # Flags. A decision cycle is wanted (the runtime runs it once per batch); profile
        # bookkeeping scans every waiting trial, so it runs only after something it
        # depends on changed (studies, profiles, nodes) or while a profile job waits for
        # a GPU to drain; a decision failed (the next tick tries again).
        self.decision_wanted = False
        self.profiling_dirty = True
        self.profiling_waiting = False
        self.decide_again = False
        j.on_rollback(self.forget_caches)

    def forget_caches(self) -> None:
        """Every cache derived from journaled state, invalidated after a rollback."""
        self.key_of_trial.clear()
        self.needs_cache.clear()  # it may hold needs of a profile that was undone
        self.rankings.clear()  # they may hold a rung value that was undone
        self.ladders.clear()  # a study id may come back with another space
        self.profiling_dirty = True  # what was planned may have been undone

    def decide(self) -> list[Command]:
        """Ask for a decision cycle: the runtime runs it once, after the batch's events
        (a handler returns its own commands, and the cycle's come with the batch's)."""
        self.decision_wanted = True
        return []

    def undone_if_raises(self) -> AbstractContextManager[None]:
        """Whatever the block changes, in memory and in the store, is undone if it raises
        (and the error raised on): the one undo."""
        return _Undone(self)

    def forget_profile_failure(self, slot: Slot) -> None:
        """The history changed for this slot: what failed there is tried afresh."""
        self.profile_failed.pop(slot, None)
        self.profile_tried.pop(slot, None)

    def nodes_for(self, study_id: str, nodes: list[Node]) -> list[Node]:
        """The nodes that run this study's trials: those of any owner, or of its own
        (a node whose agent is not root runs one owner's trials; see NodeSpec.owner)."""
        owner = self.studies[study_id].owner
        if self.cluster.owners() <= {"", owner}:
            return nodes  # every node of the cluster takes this owner's trials
        return [n for n in nodes if n.spec.takes(owner)]

    def set_ratios(self, ratios: Mapping[str, float]) -> None:
        """Server-wide oversubscription ratios from now on (a learned sharing level:
        orchestrator/sharing.py); a study's own ratios still win. Trials placed under
        the old ratios keep running; decisions from now use these."""
        merged = {**self.config.oversubscription, **ratios}
        self.config = replace(self.config, oversubscription=merged)
        self.decision_wanted = True

    def fusion_on(self, space: SearchSpace) -> bool:
        """Whether a study's trials may run as fused groups on this server."""
        return self.config.fusion and not self.config.exclusive and fusion.enabled(space)


def short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class _Undone:
    """CoreState.undone_if_raises: a journal mark and a store savepoint around the block;
    if the block, or the savepoint's own ending, raises, memory goes back to the mark
    (the savepoint has taken the store back). A class, not a generator: every event of
    every batch opens one."""

    __slots__ = ("_mark", "_s", "_savepoint")

    def __init__(self, s: CoreState) -> None:
        self._s = s
        self._mark = 0
        self._savepoint: AbstractContextManager[None] | None = None

    def __enter__(self) -> None:
        self._mark = self._s.journal.mark()
        savepoint = self._s.store.savepoint()
        try:
            savepoint.__enter__()
        except BaseException:
            self._s.journal.rollback_to(self._mark)
            raise
        self._savepoint = savepoint

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        assert self._savepoint is not None
        try:
            self._savepoint.__exit__(kind, exc, tb)
        except BaseException:
            self._s.journal.rollback_to(self._mark)
            raise
        if kind is not None:
            self._s.journal.rollback_to(self._mark)
