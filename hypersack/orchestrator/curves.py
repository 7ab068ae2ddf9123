"""What the store keeps of each trial for people, beside its record: its learning curve
(each step's metrics, as reported) and its spans (each attempt's node, GPU, launch and
end: the study's real Gantt). Written in the event's batch, so an undone event leaves
neither behind."""

from __future__ import annotations

from hypersack.core.types import (
    MAX_HISTORY_METRICS,
    HistoryStep,
    Span,
    TrialRecord,
    TrialState,
)
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.events import TrialProgress
from hypersack.orchestrator.state import CoreState


def kept(metrics: dict[str, float], objective: str) -> dict[str, float]:
    """The metrics a step keeps: the objective first, then the others by name, at most
    MAX_HISTORY_METRICS."""
    names = ([objective] if objective in metrics else []) + sorted(
        k for k in metrics if k != objective)
    return {k: metrics[k] for k in names[:MAX_HISTORY_METRICS]}


class Curves:
    def __init__(self, s: CoreState, book: Book) -> None:
        self.s = s
        book.on_transition.append(self._moved)
        book.on_release.append(self._released)

    def _moved(self, old: TrialRecord, new: TrialRecord) -> None:
        if new.state == TrialState.RUNNING and old.state != TrialState.RUNNING:
            self.s.launched_at[new.id] = self.s.clock.now()

    def _released(self, t: TrialRecord) -> None:
        """An attempt ended (or was stopped): its span on its GPU."""
        start = self.s.launched_at.pop(t.id, None)
        if not self.s.config.history or t.node is None or t.gpu_index is None:
            return
        if start is None:  # launched before this server started: its first start
            start = t.started_at if t.started_at is not None else self.s.clock.now()
        # Written with the batch's trials (Book.flush); journaled, so an undone event's
        # span goes with it.
        self.s.spans[t.id, t.launches] = Span(t.id, t.launches, t.node, t.gpu_index, start,
                                              max(start, self.s.clock.now()), t.group)

    def progress(self, t: TrialRecord, event: TrialProgress) -> None:
        """A running trial's report: each step it names, with that step's own metrics
        (an agent sends every step since its last message; without them, the latest)."""
        if not self.s.config.history:
            return
        objective = self.s.spaces[t.study_id].settings.objective.metric
        steps = event.steps or ((event.step, event.metrics),)
        rows: dict[int, dict[str, float]] = {}
        for step, metrics in steps:
            rows[step] = {**rows.get(step, {}), **metrics}
        now = self.s.clock.now()
        out = [HistoryStep(t.id, step, now, kept(metrics, objective))
               for step, metrics in sorted(rows.items()) if metrics]
        if out:
            self.s.store.add_history(out)
