"""The trial book: studies and trials, their indexes, and every change of a trial's
state (with the allocations it implies). Other modules listen to transitions
(`on_transition`) and releases (`on_release`) instead of being called from here."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

from hypersack.core.errors import NotFound
from hypersack.core.types import (
    StudyRecord,
    StudyState,
    TrialRecord,
    TrialState,
)
from hypersack.grid import rungs
from hypersack.grid.trial import check_transition
from hypersack.orchestrator.commands import (
    Command,
    DropCheckpoint,
)
from hypersack.orchestrator.journal import OrderedJournaledDict, journaled
from hypersack.orchestrator.state import HOLDS_NOTHING, RUNG_ORDER, CoreState

log = logging.getLogger(__name__)


class Book:
    def __init__(self, s: CoreState) -> None:
        self.s = s
        # Called with (old, new) after every change of a trial's record; and with the
        # trial before it gives back what it held.
        self.on_transition: list[Callable[[TrialRecord, TrialRecord], None]] = []
        self.on_release: list[Callable[[TrialRecord], None]] = []

    # ----------------------------------------------------------------- queries
    def studies(self) -> list[StudyRecord]:
        return sorted(self.s.studies.values(), key=lambda s: s.seq)

    def study(self, study_id: str) -> StudyRecord:
        try:
            return self.s.studies[study_id]
        except KeyError:
            raise NotFound(f"no study {study_id!r}") from None

    def trial(self, trial_id: str) -> TrialRecord:
        try:
            return self.s.trials[trial_id]
        except KeyError:
            raise NotFound(f"no trial {trial_id!r}") from None

    # ----------------------------------------------------------------- changes

    def set(self, t: TrialRecord, **changes: Any) -> TrialRecord:
        """The one way a trial's record changes: its indexes follow, and every listener
        hears of it."""
        if "state" in changes and changes["state"] != t.state:
            check_transition(t.id, t.state, changes["state"])
        marks = self.s.exit_marks
        if marks and t.id in marks:
            changes.setdefault("exited", marks.pop(t.id))
        new = t.model_copy(update=changes)
        was, now = t.state == TrialState.PENDING, new.state == TrialState.PENDING
        if was or now:
            old_group = self.group(t) if was else None
            new_group = self.group(new) if now else None
            if old_group != new_group:
                if was:
                    self.count_group(t, -1, old_group)
                if now:
                    self.count_group(new, 1, new_group)
        if new.state != t.state:
            self.count_state(t.study_id, t.state, -1)
            self.count_state(t.study_id, new.state, 1)
        if new.state.terminal != t.state.terminal:
            self.s.open[t.study_id] += -1 if new.state.terminal else 1
        if (new.state == TrialState.PENDING) != (t.state == TrialState.PENDING):
            waiting = self.waiting_in(t.study_id)
            if new.state == TrialState.PENDING:
                waiting[t.id] = self.wait_order(new)
            else:
                del waiting[t.id]
        if (new.state == TrialState.PAUSED) != (t.state == TrialState.PAUSED):
            self.s.paused[t.study_id] = self.s.paused.get(t.study_id, 0) + (
                1 if new.state == TrialState.PAUSED else -1)
        self.s.trials[t.id] = new
        self.s.dirty.add(t.id)
        for listener in self.on_transition:
            listener(t, new)
        return new

    def settle_marks(self) -> None:
        """At an event's end: the exits it handled whose trial has not changed since are
        marked now (CoreState.exit_marks)."""
        marks = self.s.exit_marks
        while marks:
            trial_id, attempt = marks.popitem()
            t = self.s.trials.get(trial_id)
            if t is not None and t.exited < attempt:
                self.set(t, exited=attempt)

    def count_state(self, study_id: str, state: TrialState, delta: int) -> None:
        """The one place a study's trial count per state moves (see `added`)."""
        key = (study_id, state)
        n = self.s.state_counts.get(key, 0) + delta
        if n:
            self.s.state_counts[key] = n
        elif key in self.s.state_counts:
            del self.s.state_counts[key]

    def added(self, t: TrialRecord) -> None:
        """A trial's record enters the state (submitted, extended, or loaded)."""
        self.s.trials[t.id] = t
        self.count_state(t.study_id, t.state, 1)

    def count_group(self, t: TrialRecord, delta: int,
                     group: tuple[int, int | None, float] | None = None) -> None:
        counts = self.s.pending_groups.get(t.study_id)
        if counts is None:
            counts = self.s.pending_groups[t.study_id] = journaled(self.s.journal)
        group = group if group is not None else self.group(t)
        n = counts.get(group, 0) + delta
        if n > 0:
            counts[group] = n
        elif group in counts:
            del counts[group]

    def wait_order(self, t: TrialRecord) -> int:
        """A pending trial's place in its study's queue: the study's order, except that
        a trial promoted past a rung comes before every trial of a lower rung (ASHA runs
        promotions first)."""
        return self.s.place.get(t.id, 0) - int(t.done_epochs) * RUNG_ORDER

    def waiting_in(self, study_id: str) -> OrderedJournaledDict[str]:
        waiting = self.s.waiting.get(study_id)
        if waiting is None:
            waiting = self.s.waiting[study_id] = OrderedJournaledDict(self.s.journal)
        return waiting

    def pending_of(self, study_id: str) -> list[TrialRecord]:
        """The study's PENDING trials, in the study's order."""
        return list(self.pending_in_order(study_id))

    def pending_in_order(self, study_id: str) -> Iterator[TrialRecord]:
        """The same, one at a time: a decision that reads the first few of 20,000 pending
        trials does not build the rest (the order is kept as trials come and go)."""
        waiting = self.s.waiting.get(study_id)
        if not waiting:
            return iter(())
        trials = self.s.trials
        return (trials[tid] for _, tid in list(waiting.ordered()))

    def has_pending(self, study_id: str) -> bool:
        return bool(self.s.waiting.get(study_id))

    def requeue(self, t: TrialRecord, **changes: Any) -> None:
        """Back to PENDING, holding no GPU."""
        self.set(t, state=TrialState.PENDING, **HOLDS_NOTHING, **changes)

    def fail(self, t: TrialRecord, reason: str, **changes: Any) -> None:
        """FAILED for good, with the reason a person will read (the caller sees whether
        its study is done: Pruning.maybe_done)."""
        self.set(t, state=TrialState.FAILED, node=None, gpu_index=None, reason=reason,
                 finished_at=self.s.clock.now(), **changes)

    def set_study(self, study: StudyRecord, state: StudyState) -> None:
        self.s.studies[study.id] = study.model_copy(update={"state": state})
        self.s.dirty_studies.add(study.id)

    def flush(self) -> None:
        # An id whose record a refused event added and the journal took back is skipped.
        for sid in sorted(self.s.dirty_studies):
            if sid in self.s.studies:
                self.s.store.update_study(self.s.studies[sid])
        trials = self.s.trials
        changed = [trials[tid] for tid in sorted(self.s.dirty) if tid in trials]
        if changed:
            self.s.store.update_trials(changed)
        if self.s.spans:
            self.s.store.add_spans(list(self.s.spans.values()))
            self.s.spans.clear()
        self.s.dirty.clear()
        self.s.dirty_studies.clear()

    def release(self, trial_id: str) -> None:
        """The trial gives back what it held; what it was seen using is fed back. A
        member of a fused group that goes on gives back its compute and cores, and its
        memory passes to a member still running: the group's process keeps the stacked
        parameters until it ends."""
        t = self.s.trials[trial_id]
        for listener in self.on_release:
            listener(t)
        self.s.cluster.release(trial_id, t.node, t.gpu_index, t.demand)
        if not t.group or t.group not in self.s.groups:
            return
        others = tuple(m for m in self.s.groups[t.group] if m != trial_id)
        if others:
            self.s.groups[t.group] = others
        else:
            del self.s.groups[t.group]
        heir = self.s.trials[others[0]] if others else None
        if heir is None or t.demand is None or heir.demand is None or \
                heir.state != TrialState.RUNNING or (heir.node, heir.gpu_index) != (
                    t.node, t.gpu_index):
            return
        node = self.s.cluster.get(heir.node)
        gpu = self.s.cluster.gpu(heir.node, heir.gpu_index)
        if node is None or gpu is None:
            return
        self.s.cluster.release(heir.id, heir.node, heir.gpu_index, heir.demand)
        demand = heir.demand.model_copy(
            update={"memory_mib": heir.demand.memory_mib + t.demand.memory_mib})
        self.s.cluster.allocate(heir.id, node, gpu, demand)
        self.set(heir, demand=demand)

    def bracket(self, t: TrialRecord) -> int:
        space = self.s.spaces[t.study_id]
        if space.pruner is None:
            return 0
        return rungs.bracket_of(space.pruner, space.settings.epochs, self.s.place.get(t.id, 0))

    def ladder(self, t: TrialRecord) -> tuple[int, ...]:
        """The rungs of a trial's bracket (none without a pruner)."""
        return self.bracket_ladder(t.study_id, self.bracket(t))

    def bracket_ladder(self, study_id: str, bracket: int) -> tuple[int, ...]:
        ladder = self.s.ladders.get((study_id, bracket))
        if ladder is None:
            space = self.s.spaces[study_id]
            ladder = () if space.pruner is None else rungs.rungs(
                space.pruner, space.settings.epochs, bracket)
            self.s.ladders[study_id, bracket] = ladder
        return ladder

    def segment(self, t: TrialRecord) -> float:
        """The epochs a trial's next attempt runs: to its next rung where the pruner
        pauses trials, else to its end; from its checkpoint."""
        end = t.epochs
        if self.s.spaces[t.study_id].pause_mode():
            end = rungs.next_rung(self.ladder(t), t.done_epochs) or t.epochs
        return max(end - t.done_epochs, 0.0) or t.epochs

    def group(self, t: TrialRecord) -> tuple[int, int | None, float]:
        """Trials of one group are interchangeable for placement: one workload, one
        memory correction, one length."""
        return (self.key_number(t), t.memory_override_mib, self.segment(t))

    def key_number(self, t: TrialRecord) -> int:
        """A small number per workload key, kept per trial: comparing keys themselves
        (pydantic models) is most of what grouping thousands of trials costs."""
        number = self.s.key_of_trial.get(t.id)
        if number is None:
            number = self.s.key_numbers.setdefault(t.key, len(self.s.key_numbers))
            self.s.key_of_trial[t.id] = number
        return number

    def add_trials(self, study_id: str, trials: list[TrialRecord]) -> None:
        self.s.store.add_trials(trials)
        ids = self.s.by_study[study_id]
        self.s.by_study[study_id] = [*ids, *(t.id for t in trials)]
        self.s.open[study_id] += len(trials)
        waiting = self.waiting_in(study_id)
        for i, t in enumerate(trials, start=len(ids)):
            self.added(t)
            self.s.place[t.id] = i
            waiting[t.id] = self.wait_order(t)
            self.count_group(t, 1)
        self.s.profiling_dirty = True  # a new workload key may want a profile
        log.info("study %s: %d new trial(s), %d of %d", study_id, len(trials),
                 len(self.s.by_study[study_id]), self.s.spaces[study_id].size())

    def asks_left(self, study_id: str) -> int:
        space = self.s.spaces[study_id]
        if not space.search.adaptive:
            return 0
        return space.size() - len(self.s.by_study[study_id])

    def with_group(self, t: TrialRecord) -> list[TrialRecord]:
        """A trial and the other members of its fused group: a group stops whole (its
        process holds the stacked memory until it ends)."""
        if not t.group or t.group not in self.s.groups:
            return [t]
        return [self.s.trials[m] for m in self.s.groups[t.group]]

    def warn(self, study_id: str, text: str) -> None:
        """A warning on the study, once: the first trial that gives cause says it."""
        study = self.s.studies[study_id]
        if len(study.warnings) >= 8 or any(w.split(" (")[0] == text.split(" (")[0]
                                           for w in study.warnings):
            return
        self.s.studies[study_id] = study.model_copy(update={"warnings": (*study.warnings, text)})
        self.s.dirty_studies.add(study_id)
        log.warning("study %s: %s", study_id, text)

    def checkpoints_to_drop(self) -> list[Command]:
        """The checkpoints of the trials pruned by what was just handled (those an undone
        part took back are no longer PRUNED, and keep theirs)."""
        return [DropCheckpoint(tid, self.s.trials[tid].study_id, node)
                for tid, node in self.s.drops
                if tid in self.s.trials and self.s.trials[tid].state == TrialState.PRUNED]
