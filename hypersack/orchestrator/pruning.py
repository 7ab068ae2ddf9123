"""Rungs and pruning (ASHA, Hyperband, median): a report in; go on, prune or pause out.
And the end of a study, once nothing runs, waits or is left to ask."""

from __future__ import annotations

import logging
import math

from hypersack.core.types import (
    MAX_RUNG_VALUES,
    StudyState,
    TrialRecord,
    TrialState,
)
from hypersack.grid import rungs
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.commands import (
    Command,
    KillTrial,
)
from hypersack.orchestrator.events import (
    TrialFinished,
    TrialProgress,
)
from hypersack.orchestrator.state import HOLDS_NOTHING, CoreState

log = logging.getLogger(__name__)


class Pruning:
    def __init__(self, s: CoreState, book: Book) -> None:
        self.s = s
        self.book = book
        book.on_transition.append(self._heard)

    def _heard(self, old: TrialRecord, new: TrialRecord) -> None:
        """A trial that stops running forgets its last reported epoch; one that pauses or
        resumes at a rung joins or leaves that rung's paused trials."""
        if old.state == TrialState.RUNNING and new.state != TrialState.RUNNING:
            self.s.last_step.pop(old.id, None)
        if (new.state == TrialState.PAUSED) != (old.state == TrialState.PAUSED) and \
                self.s.rankings.get(old.study_id) is not None:
            if new.state == TrialState.PAUSED:
                self.ranking(new, int(new.done_epochs)).paused.add(new.id)
            else:
                self.ranking(old, int(old.done_epochs)).paused.discard(old.id)

    def ranking(self, t: TrialRecord, rung: int) -> rungs.Ranking:
        """The ranking at a rung of the trial's bracket."""
        by_rung = self.rankings_of(t.study_id)
        key = (self.book.bracket(t), rung)
        ranking = by_rung.get(key)
        if ranking is None:
            minimize = self.s.spaces[t.study_id].settings.objective.mode == "min"
            ranking = by_rung[key] = rungs.Ranking(minimize)
        return ranking

    def rankings_of(self, study_id: str) -> dict[tuple[int, int], rungs.Ranking]:
        """A study's rankings, built from its trials' records when not cached."""
        by_rung = self.s.rankings.get(study_id)
        if by_rung is None:
            by_rung = self.s.rankings[study_id] = {}
            for tid in self.s.by_study[study_id]:
                t = self.s.trials[tid]
                for rung, value in t.rungs.items():
                    self.ranking(t, int(rung)).add(t.id, value)
                if t.state == TrialState.PAUSED:
                    self.ranking(t, int(t.done_epochs)).paused.add(t.id)
        return by_rung

    def at_rung(self, t: TrialRecord, event: TrialProgress) -> list[Command]:
        """A running trial reported an epoch: where it is a rung, keep the objective for
        the pruner and, unless the trial pauses there to be ranked, stop it now if it
        ranks too low."""
        space = self.s.spaces[t.study_id]
        pruner = space.pruner
        value = event.metrics.get(space.settings.objective.metric)
        step = event.step
        if pruner is not None and step > self.s.last_step.get(t.id, 0):
            self.s.last_step[t.id] = step
        if pruner is None or value is None or step in t.rungs or \
                len(t.rungs) >= MAX_RUNG_VALUES or step not in self.book.ladder(t):
            return []
        self.rankings_of(t.study_id)  # built before the new value is recorded
        t = self.book.set(t, rungs={**t.rungs, step: value})
        ranking = self.ranking(t, step)
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
        return self.end_now(t, TrialState.PRUNED, why, event)

    def paused_at_rung(self, t: TrialRecord, event: TrialFinished) -> bool:
        """A trial of a pausing pruner ended its attempt at its rung (with the rung's
        objective reported): it waits, PAUSED, to be promoted or pruned."""
        rung = t.stop_at
        last = self.s.last_step.pop(t.id, None)
        if rung is None or rung not in t.rungs or rung >= t.epochs or \
                (last is not None and last > rung):
            return False  # not at a rung, or it trained on past it (it ignores pauses)
        self.book.set(t, state=TrialState.PAUSED, **HOLDS_NOTHING, done_epochs=float(rung),
                  stop_at=None, metrics=dict(event.metrics), log_tail=event.log_tail[-4000:],
                  reason=f"paused at rung {rung}")
        self.rung_decisions(t.study_id)
        self.maybe_done(t.study_id)
        return True

    def rung_decisions(self, study_id: str) -> None:
        """ASHA's promotions: at each rung the best n // eta of the n trials ranked there go
        on (the paused ones among them resume); a paused trial that can never be among
        them, however the others do, is pruned now. Costs what is paused, not the
        study's size."""
        space = self.s.spaces[study_id]
        pruner = space.pruner
        if pruner is None or not self.s.paused.get(study_id) or \
                self.s.studies[study_id].state != StudyState.ACTIVE:
            for key in [k for k in self.s.windows if k[0] == study_id]:
                del self.s.windows[key]  # nothing left to promote
            return
        eta = pruner.reduction_factor
        epochs = space.settings.epochs
        count = rungs.brackets(pruner, epochs)
        now = self.s.clock.now()
        for (bracket, rung), ranking in sorted(self.rankings_of(study_id).items()):
            if not ranking.paused:
                continue
            ladder = self.book.bracket_ladder(study_id, bracket)
            index = ladder.index(rung) if rung in ladder else 0
            total = rungs.bracket_size(space.size(), count, bracket)
            go_on = rungs.promoted_count(len(ranking), eta)
            for tid in sorted(ranking.paused):
                t = self.s.trials[tid]
                rank = ranking.rank(tid, t.rungs[rung])
                if rank < go_on:
                    if self.held(study_id, rung, pruner.promotion_window_s, now):
                        continue
                    self.book.set(t, state=TrialState.PENDING,
                              reason=f"promoted at rung {rung} (ranked {rank + 1} of "
                                     f"{len(ranking)})")
                elif rungs.never_promoted(rank, total, eta, index):
                    self.prune_paused(t, f"pruned at rung {rung}: ranked {rank + 1} of "
                                          f"{len(ranking)}, outside the best 1/{eta}")
        # A window closes once it has passed (its promotions went) or nothing waits at
        # its rung any more: a window left open would keep the study from ending.
        waiting_at = {rung for (_, rung), r in self.rankings_of(study_id).items() if r.paused}
        for key in [k for k in self.s.windows if k[0] == study_id]:
            if self.s.windows[key] <= now or key[1] not in waiting_at:
                del self.s.windows[key]

    def held(self, study_id: str, rung: int, window_s: float, now: float) -> bool:
        """Whether a rung's promotions wait for their window: the first opens it; once
        it has passed, every promotion of the rung goes (and a later one opens another)."""
        if window_s <= 0:
            return False
        due = self.s.windows.get((study_id, rung))
        if due is None:
            self.s.windows[study_id, rung] = now + window_s
            return True
        return now < due

    def finish_rungs(self, study_id: str) -> None:
        """Nothing runs, waits or is left to ask, and trials are paused at rungs: in each
        bracket, the best trial at the highest rung goes on where none went further;
        otherwise the paused ones lost and are pruned."""
        space = self.s.spaces[study_id]
        minimize = space.settings.objective.mode == "min"
        by_bracket: dict[tuple[int, ...], list[TrialRecord]] = {}
        for tid in self.s.by_study[study_id]:
            t = self.s.trials[tid]
            by_bracket.setdefault(self.book.ladder(t), []).append(t)
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
                    self.book.set(t, state=TrialState.PENDING,
                              reason=f"promoted at rung {int(top)}: the best there, and "
                                     "the search has nothing else to run")
                else:
                    self.prune_paused(t, f"pruned at rung {int(t.done_epochs)}: the search "
                                          "ended with better trials ahead of it")

    def prune_paused(self, t: TrialRecord, why: str) -> None:
        self.book.set(t, state=TrialState.PRUNED, reason=why, finished_at=self.s.clock.now())
        if t.launched_on is not None:
            self.s.drops.append((t.id, t.launched_on))
        log.info("%s %s", t.id, why)

    def release_due(self, now: float) -> bool:
        """Promotions whose window passed resume; True if there were any."""
        due = sorted({sid for (sid, _), at in self.s.windows.items() if at <= now})
        for sid in due:
            self.rung_decisions(sid)
            self.maybe_done(sid)
        return bool(due)

    def wake_at(self) -> float | None:
        """The next time a tick has something to do besides checking heartbeats (a held
        promotion resuming); None: nothing waits on time."""
        return min(self.s.windows.values(), default=None)

    def stop_study(self, study_id: str, state: StudyState, why: str) -> list[Command]:
        """End an active study now: its running trials are killed, every trial not yet
        ended is CANCELLED with `why`, and the study takes `state` (CANCELLED, or FAILED
        when its trials cannot give what it asks)."""
        study = self.book.study(study_id)
        if study.state != StudyState.ACTIVE:
            return []
        commands: list[Command] = []
        for tid in self.s.by_study[study_id]:
            t = self.s.trials[tid]
            if t.state == TrialState.RUNNING:
                assert t.node is not None
                commands.append(KillTrial(t.id, t.node, why, attempt=t.launches))
                self.book.release(t.id)
            if not t.state.terminal:
                self.book.set(t, state=TrialState.CANCELLED, reason=why,
                              finished_at=self.s.clock.now())
        self.book.set_study(study, state)
        if state != StudyState.CANCELLED:
            self.book.warn(study_id, why)
        self.rung_decisions(study_id)  # closes its promotion windows
        return commands

    def maybe_done(self, study_id: str) -> None:
        study = self.s.studies[study_id]
        if study.state != StudyState.ACTIVE or self.book.asks_left(study_id):
            return
        if self.s.open[study_id] and self.s.open[study_id] == self.s.paused.get(study_id, 0) \
                and not any(sid == study_id for sid, _ in self.s.windows):
            # Only paused trials left, none held for a window: the rankings are final.
            self.finish_rungs(study_id)
        if self.s.open[study_id] == 0:
            states = [self.s.trials[i].state for i in self.s.by_study[study_id]]
            # Every trial failed or diverged: the study failed, and says so.
            done = (StudyState.COMPLETED if TrialState.COMPLETED in states
                    else StudyState.FAILED)
            self.book.set_study(self.s.studies[study_id], done)
            log.info("study %s %s", study_id, done.value.lower())

    def end_now(self, t: TrialRecord, state: TrialState, why: str, event: TrialProgress
                 ) -> list[Command]:
        """Stop a running trial for good as it reports (diverged, pruned): its process is
        killed and its capacity goes to the next decision at once."""
        node = t.node or event.node
        if state == TrialState.PRUNED:
            self.s.drops.append((t.id, node))
        self.book.release(t.id)
        self.book.set(self.s.trials[t.id], state=state, node=None, gpu_index=None, reason=why,
                  metrics=dict(event.metrics), finished_at=self.s.clock.now())
        self.maybe_done(t.study_id)
        log.info("%s %s", t.id, why)
        return [KillTrial(t.id, node, why, attempt=t.launches), *self.s.decide()]
