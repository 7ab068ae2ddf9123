"""The orchestrator: a deterministic state machine over studies, trials, nodes and profiles.

`handle_batch(events)` applies events, persists every change through the injected Store in
one transaction, runs one decision cycle where capacity or demand changed, and returns
the commands for the drivers to carry out. It reads time only from the injected clock.

This module is the runtime: the event table, batches with their undo, the order of a
decision cycle's phases (ask the searches, plan profiles, decide each study, preempt).
The work is the modules' over one state (`state.CoreState`): the trial book, pruning,
profiling, searches, membership, decisions, preemption, explanations, and the trial and
study events. The queries are a mixin (queries.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from hypersack.core.clock import Clock
from hypersack.core.errors import (
    HyperSackError,
    InvalidInput,
    StaleEvent,
    StoreUnavailable,
)
from hypersack.core.types import (
    StudyState,
    TrialState,
)
from hypersack.grid.space import parse_space
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.commands import Command
from hypersack.orchestrator.config import DEFAULT_RATIOS, OrchestratorConfig
from hypersack.orchestrator.curves import Curves
from hypersack.orchestrator.decide import Decider
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
    StudyCancelled,
    StudyExtended,
    StudySubmitted,
    Tick,
    TrialFailed,
    TrialFinished,
    TrialLogged,
    TrialOutOfMemory,
    TrialProgress,
    TrialsAsked,
    Wake,
)
from hypersack.orchestrator.explain import Explainer
from hypersack.orchestrator.learned import LearnedSharing
from hypersack.orchestrator.membership import Membership
from hypersack.orchestrator.preempt import Preemption
from hypersack.orchestrator.profiling import Profiling
from hypersack.orchestrator.pruning import Pruning
from hypersack.orchestrator.queries import Queries
from hypersack.orchestrator.searches import Searches
from hypersack.orchestrator.state import CoreState, Decision, short
from hypersack.orchestrator.studies import StudyEvents, submitted_workloads
from hypersack.orchestrator.trials import TrialEvents
from hypersack.store.base import Store

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_RATIOS", "BatchResult", "Decision", "Orchestrator", "OrchestratorConfig"]


@dataclass
class BatchResult:
    """What a batch of events caused: the commands, the stale events (they contradict the
    current state and changed nothing) and the refused ones (their handling raised; they
    changed nothing either)."""

    commands: list[Command] = field(default_factory=list)
    stale: list[StaleEvent] = field(default_factory=list)
    refused: list[tuple[Event, Exception]] = field(default_factory=list)


class Orchestrator(Queries):
    """Events in, commands out, over one state; the queries are `Queries`'."""

    def __init__(self, store: Store, clock: Clock, config: OrchestratorConfig | None = None
                 ) -> None:
        self.config = config or OrchestratorConfig()
        s = self.s = CoreState(store, clock, self.config)
        # The modules over the state, each given the ones it asks; they listen to the
        # book's transitions instead of being called from its state setter.
        self.book = Book(s)
        self.pruning = Pruning(s, self.book)
        self.profiling = Profiling(s, self.book, self.pruning)
        self.searches = Searches(s, self.book, self.profiling)
        self.membership = Membership(s, self.book, self.profiling)
        self.decider = Decider(s, self.book, self.pruning, self.profiling)
        self.preemption = Preemption(s, self.book, self.decider)
        self.sharing = LearnedSharing(s)
        self.sharing.rule_of = lambda sid: self.decider.policy(s.spaces[sid], sid).name
        self.book.on_transition.append(self.sharing.transition)
        self.explainer = Explainer(s, self.book, self.profiling, self.decider, self.sharing)
        self.curves = Curves(s, self.book)
        self.trial_events = TrialEvents(s, self.book, self.pruning, self.profiling,
                                        self.curves, self.sharing)
        self.study_events = StudyEvents(s, self.book, self.pruning)
        # Event dispatch: one handler per event type.
        t, m, p, st = self.trial_events, self.membership, self.profiling, self.study_events
        self._handlers: dict[type, Callable[[Any], list[Command]]] = dict([
            _handler(TrialProgress, t.on_progress),
            _handler(Heartbeat, m.on_heartbeat),
            _handler(TrialFinished, t.on_finished),
            _handler(TrialFailed, t.on_failed),
            _handler(TrialOutOfMemory, t.on_oom),
            _handler(TrialLogged, t.on_logged),
            _handler(StudySubmitted, st.on_submitted),
            _handler(StudyCancelled, st.on_cancelled),
            _handler(StudyExtended, st.on_extended),
            _handler(TrialsAsked, st.on_asked),
            _handler(NodeJoined, m.on_joined),
            _handler(NodeLost, m.on_lost),
            _handler(NodeDrained, m.on_drained),
            _handler(ProfileMeasured, p.on_profile),
            _handler(ProfileFailed, p.on_profile_failed),
            _handler(ProfilesImported, p.on_imported),
            _handler(ProfilesForgotten, p.on_forgotten),
            _handler(Tick, self._on_tick),
            _handler(Wake, self._on_wake),
        ])
        self._restore()

    # ----------------------------------------------------------------- restore
    def _restore(self) -> None:
        """Rebuild from the store: a restarted server resumes every study where it was."""
        now = self.s.clock.now()
        for p in self.s.store.list_profiles():
            self.s.profiles[p.key, p.arch] = p
        # Restored nodes get a grace period: their agents need a moment to find the
        # restarted server before silence means they are gone.
        for rec in self.s.store.list_nodes():
            self.s.cluster.add(rec, now + self.s.config.restore_grace_s)
        for study in self.s.store.list_studies():
            self.s.studies[study.id] = study
            self.s.spaces[study.id] = parse_space(study.space, source=f"study {study.id}")
            self.s.by_study[study.id] = []
            self.s.open[study.id] = 0
        for t in self.s.store.list_trials():
            self.book.added(t)
            self.s.by_study.setdefault(t.study_id, []).append(t.id)
            self.s.place[t.id] = len(self.s.by_study[t.study_id]) - 1  # as when submitted
            if t.state == TrialState.PENDING:
                self.book.waiting_in(t.study_id)[t.id] = self.book.wait_order(t)
                self.book.count_group(t, 1)
            self.s.open[t.study_id] = self.s.open.get(t.study_id, 0) + (not t.state.terminal)
            if t.state == TrialState.PAUSED:
                self.s.paused[t.study_id] = self.s.paused.get(t.study_id, 0) + 1
            if t.state == TrialState.RUNNING:
                node = self.s.cluster.get(t.node)
                gpu = self.s.cluster.gpu(t.node, t.gpu_index)
                if node is None or gpu is None or t.demand is None:
                    # Its node is gone from the inventory: run it again.
                    self.book.requeue(t)
                else:
                    self.s.cluster.allocate(t.id, node, gpu, t.demand)
                    if t.group:
                        self.s.groups[t.group] = (*self.s.groups.get(t.group, ()), t.id)
        if self.s.dirty:
            with self.s.store.transaction():
                self.book.flush()
        self.sharing.restore()
        log.info("restored %d studies, %d trials, %d nodes, %d profiles", len(self.s.studies),
                 len(self.s.trials), len(self.s.cluster), len(self.s.profiles))

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
        events = list(events)
        # Before anything is placed: a study of work new to the learned sharing level
        # starts at the configured ratio (orchestrator/learned.py).
        arriving = [e for e in events if isinstance(e, StudySubmitted)]
        for e in arriving:
            self.decider.expect(e.space)
        if arriving and self.sharing.learner is not None:
            self.sharing.arriving([(submitted_workloads(e), e.space.settings.oversubscription)
                                   for e in arriving])
        self.s.journal.begin()
        try:
            with self.s.store.transaction():
                self.s.decision_wanted = False
                for event in events:
                    self._guarded(event, result)
                if self.s.decision_wanted:
                    self._guarded(None, result)
                self.book.flush()
        except BaseException as exc:
            self.s.journal.rollback_to(0)
            self.s.decide_again = True
            self.s.dirty.clear()
            self.s.dirty_studies.clear()
            if self.s.store.failed(exc) and not isinstance(exc, StoreUnavailable):
                raise StoreUnavailable(str(exc)[:300]) from exc
            raise
        finally:
            self.s.journal.end()
        self.sharing.commit()
        return result

    def _guarded(self, event: Event | None, result: BatchResult) -> None:
        """Handle one event (None: decide), undoing all it did if it raises."""
        try:
            with self.s.undone_if_raises():
                commands = self._dispatch(event) if event is not None else self._cycle()
                self.book.settle_marks()
        except StaleEvent as exc:
            result.stale.append(exc)
        except Exception as exc:
            if self.s.store.failed(exc):
                raise  # the whole batch is undone: see handle_batch
            what = "a decision" if event is None else short(repr(event))
            if isinstance(exc, HyperSackError):
                log.warning("refused %s: %s", what, exc)
            else:
                log.exception("refused %s: its handling failed; nothing changed", what)
            if event is not None:
                result.refused.append((event, exc))
            else:
                self.s.decide_again = True
        else:
            result.commands += commands + self.book.checkpoints_to_drop()
        finally:
            self.s.drops.clear()
            self.s.exit_marks.clear()

    def _dispatch(self, event: Event) -> list[Command]:
        handler = self._handlers.get(type(event))
        if handler is None:
            raise InvalidInput(f"unknown event {short(repr(event))}")
        if not isinstance(event, _ROUTINE):
            self.s.profiling_dirty = True
        return handler(event)

    def _on_tick(self, event: Tick) -> list[Command]:
        """Nodes silent too long are lost. A tick decides only then, or where the last
        decision failed: with nothing changed, a decision would find what the last one
        found."""
        timeout = self.s.config.heartbeat_timeout_s
        now = self.s.clock.now()
        silent = self.s.cluster.silent(now, timeout)
        for name in silent:
            self.membership.lose(name, f"no heartbeat for {timeout:g} s")
        due = self.pruning.release_due(now)
        chosen = self.decider.rules.settle()  # predict's choices made in the background
        return self.s.decide() if silent or due or chosen or self.s.decide_again else []

    def _on_wake(self, event: Wake) -> list[Command]:
        return self.s.decide() if self.pruning.release_due(self.s.clock.now()) else []

    # ----------------------------------------------------------------- the cycle
    def _cycle(self) -> list[Command]:
        """One decision cycle, its phases in order: ask the searches for trials where
        capacity frees, plan profiles, decide for every active study (priorities, fair
        shares, reservations), then preempt for the studies that ask for it."""
        s = self.s
        s.decision_wanted = False
        s.decide_again = False
        commands: list[Command] = []
        open_nodes = s.cluster.open_nodes()
        archs = s.cluster.open_archs()
        active = [study for study in self.book.studies() if study.state == StudyState.ACTIVE]
        if open_nodes:
            self.searches.ask(active, open_nodes, archs)
        if s.profiling_dirty or s.profiling_waiting:
            commands += self.profiling.profile_missing(active, open_nodes, archs)
            s.profiling_dirty = False
        if not active or not open_nodes:
            return commands
        decided, cycle = self.decider.decide_all(active, open_nodes, archs)
        return commands + decided + self.preemption.preempt(cycle, open_nodes, archs)


# Events after which profile bookkeeping has nothing new to see (a trial's exit frees a
# GPU, which matters to it only while profiling waits).
_ROUTINE = (TrialProgress, Heartbeat, TrialFinished, TrialFailed, Tick, Wake)

E = TypeVar("E")


def _handler(kind: type[E], fn: Callable[[E], list[Command]]
             ) -> tuple[type, Callable[[Any], list[Command]]]:
    """One entry of the dispatch table, type-checked: `fn` takes events of `kind`."""
    return kind, fn
