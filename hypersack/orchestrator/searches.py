"""Optuna's searches: asked for trials as capacity frees, told of every trial that ends."""

from __future__ import annotations

import logging
import time

from hypersack.core.types import (
    StudyRecord,
    TrialRecord,
)
from hypersack.grid.adaptive import OptunaSearch
from hypersack.grid.expand import asked_trial
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.cluster import Node
from hypersack.orchestrator.profiling import Profiling
from hypersack.orchestrator.state import CoreState
from hypersack.policies.base import (
    Need,
)

log = logging.getLogger(__name__)


class Searches:
    def __init__(self, s: CoreState, book: Book, profiling: Profiling) -> None:
        self.s = s
        self.book = book
        self.profiling = profiling
        book.on_transition.append(self._tell)

    def _tell(self, old: TrialRecord, new: TrialRecord) -> None:
        """A study's search hears of every trial of it that ends."""
        search = self.s.searches.get(new.study_id)
        if search is not None and new.state.terminal and not old.state.terminal \
                and not search.stale:
            self.s.journal.touch(search)
            search.tell(new)

    def search(self, study_id: str) -> OptunaSearch:
        """A study's Optuna search, rebuilt from its trials where it is new or stale."""
        search = self.s.searches.get(study_id)
        if search is None:
            search = self.s.searches[study_id] = OptunaSearch(self.s.spaces[study_id])
        if search.stale:
            search.rebuild(self.s.trials[i] for i in self.s.by_study[study_id])
        return search

    def ask(self, active: list[StudyRecord], open_nodes: list[Node],
             archs: frozenset[str]) -> None:
        """Ask each Optuna search for as many new trials as the free capacity could hold
        beyond what the study already has waiting: a batch asked at once (the sampler
        sees the ones not yet told), none while the cluster is full."""
        for study in active:
            space = self.s.spaces[study.id]
            left = self.book.asks_left(study.id)
            if left <= 0 or space.search.type != "optuna":
                continue
            view = self.s.cluster.view(open_nodes, space.settings.oversubscription)
            gpus = view.gpus()
            if not gpus:
                continue
            per_gpu = sum(g.full_compute for g in gpus) / len(gpus)
            room = float(sum(g.compute for g in gpus))
            for t in self.book.pending_of(study.id):
                room -= self.least_compute(t, archs, per_gpu, space)
            asked: list[TrialRecord] = []
            search: OptunaSearch | None = None
            budget = self.s.config.ask_budget_s
            began = time.perf_counter()
            while room > 0 and len(asked) < min(left, 2 * len(gpus) + 1):
                if budget is not None and asked and time.perf_counter() - began > budget:
                    self.s.decide_again = True  # the rest at the next tick
                    break
                if search is None:
                    search = self.search(study.id)
                    self.s.journal.touch(search)
                number, params = search.ask()
                t = asked_trial(space, study.id, number, params)
                asked.append(t)
                room -= self.least_compute(t, archs, per_gpu, space)
            if asked:
                self.book.add_trials(study.id, asked)

    def least_compute(self, t: TrialRecord, archs: frozenset[str], unknown: float,
                       space: SearchSpace) -> float:
        """The least scaled compute a trial needs on any architecture: from its profile,
        else from the demand the study states, else `unknown` (it will hold a GPU to be
        profiled)."""
        needs = self.profiling.needs(t, archs)
        if needs:
            return float(min(n.compute for n in needs.values()))
        computes = [Need.of(d.demand()).compute for d in map(space.settings.stated_on, archs)
                    if d is not None]
        return float(min(computes)) if computes else unknown
