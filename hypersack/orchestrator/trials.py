"""What running trials report: progress, exits, out-of-memory deaths."""

from __future__ import annotations

import logging

from hypersack.core.errors import (
    StaleEvent,
)
from hypersack.core.types import (
    StudyState,
    TrialRecord,
    TrialState,
)
from hypersack.orchestrator import fusion
from hypersack.orchestrator.book import Book
from hypersack.orchestrator.commands import (
    Command,
    KillTrial,
)
from hypersack.orchestrator.curves import Curves
from hypersack.orchestrator.events import (
    TrialFailed,
    TrialFinished,
    TrialLogged,
    TrialOutOfMemory,
    TrialProgress,
)
from hypersack.orchestrator.learned import LearnedSharing
from hypersack.orchestrator.outcomes import divergence, missing_objective, stops_study
from hypersack.orchestrator.profiling import Profiling
from hypersack.orchestrator.pruning import Pruning
from hypersack.orchestrator.retries import after_failure, after_out_of_memory
from hypersack.orchestrator.state import CoreState, short

log = logging.getLogger(__name__)


class TrialEvents:
    def __init__(self, s: CoreState, book: Book, pruning: Pruning, profiling: Profiling,
                 curves: Curves, sharing: LearnedSharing) -> None:
        self.s = s
        self.curves = curves
        self.sharing = sharing
        self.book = book
        self.pruning = pruning
        self.profiling = profiling

    def on_progress(self, event: TrialProgress) -> list[Command]:
        t = self.running_on(event.trial_id, event.node, event.attempt)
        self.curves.progress(t, event)
        self.sharing.sample(t.id, event)
        settings = self.s.spaces[t.study_id].settings
        why = divergence(settings, event.metrics, event.nonfinite)
        if why is None:
            missing = stops_study(settings, event.metrics, event.nonfinite)
            if missing:
                return self.stop_for_objective(t, missing)
            return self.pruning.at_rung(t, event)
        # Stopped now: its capacity goes to a trial that may still converge.
        return self.pruning.end_now(t, TrialState.DIVERGED, why, event)

    def running_on(self, trial_id: str, node: str, attempt: int = 0, *,
                    exit: bool = False, late: bool = True) -> TrialRecord:
        """The trial an event of `node` is about, if that node runs it in that attempt.
        An exit (`exit`) of an attempt already handled is a copy; one of the trial's
        latest attempt also counts while the trial waits to run again after a brief loss
        of its node (`late`): the work was done. Attempt 0: not said."""
        t = self.s.trials.get(trial_id)
        if t is None:
            raise StaleEvent(f"no trial {short(trial_id, 80)!r}")
        if attempt and attempt != t.launches:
            raise StaleEvent(f"trial {trial_id}: attempt {attempt} was superseded by attempt "
                             f"{t.launches}")
        if exit and attempt and attempt <= t.exited:
            # Sent again before its acknowledgement reached the agent: a copy, expected.
            raise StaleEvent(f"trial {trial_id}: the exit of attempt {attempt} was handled "
                             "already", expected=True)
        if exit and late and attempt and t.state == TrialState.PENDING and \
                t.launched_on == node:
            log.info("%s: the exit of attempt %d arrived after its node was lost; it counts",
                     trial_id, attempt)
            return t
        if t.state != TrialState.RUNNING or t.node != node:
            # A trial the server stopped (cancelled, pruned, diverged, failed) ends on the
            # node it ran on after the kill: its exit is expected, and changes nothing.
            stopped = t.state.terminal and t.launched_on == node and \
                attempt in (0, t.launches)
            raise StaleEvent(f"trial {trial_id} is {t.state.value}"
                             + (f" on {t.node}" if t.node else "") + f", not running on {node}",
                             expected=stopped)
        return t

    def exit_of(self, event: TrialFinished | TrialFailed | TrialOutOfMemory, *,
                 late: bool = True) -> TrialRecord:
        """The trial whose attempt exited, marked as exited in that attempt by the event's
        end (a repeat of the exit is then stale; CoreState.exit_marks). `late`: the exit
        counts after a loss of its node too."""
        t = self.running_on(event.trial_id, event.node, event.attempt, exit=True, late=late)
        if event.attempt:
            self.s.exit_marks[t.id] = event.attempt
        return t

    def on_finished(self, event: TrialFinished) -> list[Command]:
        t = self.exit_of(event)
        self.book.release(t.id)
        if self.pruning.paused_at_rung(t, event):
            return self.s.decide()
        settings = self.s.spaces[t.study_id].settings
        objective = event.objective
        if objective is None:
            objective = event.metrics.get(settings.objective.metric)
        why = divergence(settings, event.metrics, event.nonfinite)
        absent = objective is None or (settings.multi_objective and any(
            o.metric not in event.metrics for o in settings.goals))
        if not why and absent:
            stop = stops_study(settings, event.metrics, event.nonfinite, final=True)
            if stop:
                return self.stop_for_objective(t, stop, dict(event.metrics),
                                               event.log_tail[-4000:])
        missing = None if why or not absent else missing_objective(settings, event.metrics)
        self.book.set(t, state=TrialState.DIVERGED if why else TrialState.COMPLETED,
                  metrics=dict(event.metrics), objective=None if why else objective,
                  finished_at=self.s.clock.now(), reason=why or missing or "",
                  log_tail=event.log_tail[-4000:])
        if missing:
            self.book.warn(t.study_id, missing)
        self.pruning.maybe_done(t.study_id)
        return self.s.decide()

    def stop_for_objective(self, t: TrialRecord, missing: str,
                           metrics: dict[str, float] | None = None, log_tail: str = ""
                           ) -> list[Command]:
        """A trial reported metrics without its study's objective: it FAILED, and the
        study stops now (FAILED), saying which metrics its trials do report. `metrics`:
        those of its exit (it ended; nothing to kill or release)."""
        kill: list[Command] = []
        if metrics is None and t.node:  # still running: stopped now
            self.book.release(t.id)
            kill = [KillTrial(t.id, t.node, missing, attempt=t.launches)]
        self.book.fail(t, missing, log_tail=log_tail or t.log_tail,
                       **({} if metrics is None else {"metrics": metrics}))
        stop = self.pruning.stop_study(
            t.study_id, StudyState.FAILED,
            f"stopped: trial {t.id} {missing}")
        return kill + stop + self.s.decide()

    def on_failed(self, event: TrialFailed) -> list[Command]:
        t = self.exit_of(event)
        self.book.release(t.id)
        if event.fenced:
            self.book.requeue(t, reason=f"stopped on {event.node} by its fence (its agent did "
                                    "not hear from the server in time); it runs again, no "
                                    "failure counted")
            return self.s.decide()
        after = after_failure(event.exit_code, t.failures,
                              self.s.spaces[t.study_id].settings.retries)
        tail = event.log_tail[-4000:]
        if after.give_up:
            self.book.fail(t, after.reason, failures=after.failures, log_tail=tail)
            self.pruning.maybe_done(t.study_id)
        else:
            self.book.requeue(t, failures=after.failures, log_tail=tail, reason=after.reason)
        return self.s.decide()

    def on_logged(self, event: TrialLogged) -> list[Command]:
        """The log of an attempt the server stopped: kept with the trial (only its
        latest attempt's, from the node that ran it, once the trial left RUNNING)."""
        t = self.s.trials.get(event.trial_id)
        if t is None or t.launched_on != event.node or event.attempt != t.launches or \
                t.state == TrialState.RUNNING or not event.log_tail:
            raise StaleEvent(f"no stopped attempt {event.attempt} of trial "
                             f"{short(event.trial_id, 80)!r} on {short(event.node, 80)}")
        self.book.set(t, log_tail=event.log_tail[-4000:])
        return []

    def on_oom(self, event: TrialOutOfMemory) -> list[Command]:
        t = self.exit_of(event, late=False)
        assert t.demand is not None
        if t.group_width > 1:
            return self.group_oom(t, event)
        self.book.release(t.id)
        after = after_out_of_memory(t.demand.memory_mib, event.observed_memory_mib,
                                    self.s.config.oom_growth, self.s.cluster.largest_memory_mib())
        gpu = self.s.cluster.gpu(t.node, t.gpu_index)
        if gpu is not None:
            # Future trials of this workload ask for the grown memory from the start.
            self.profiling.feedback(t.key, gpu.arch, after.memory_mib, 0.0, t.id,
                           oom_at=t.demand.memory_mib)
        if after.give_up:
            self.book.fail(t, after.reason, memory_override_mib=after.memory_mib)
            self.pruning.maybe_done(t.study_id)
        else:
            self.book.requeue(t, memory_override_mib=after.memory_mib, reason=after.reason)
        return self.s.decide()

    def group_oom(self, t: TrialRecord, event: TrialOutOfMemory) -> list[Command]:
        """A fused group ran out of memory: its width asks for more from now on (the
        group's memory grown; a width that no longer fits is not chosen), and the member
        runs again, alone or in another group, with no failure counted."""
        gpu = self.s.cluster.gpu(t.node, t.gpu_index)
        key = fusion.fused_key(t.key, t.group_width)
        first = t.group not in self.s.oom_groups
        self.s.oom_groups[t.group] = True
        if first and gpu is not None and (key, gpu.arch) in self.s.profiles:
            held = self.s.profiles[key, gpu.arch].demand.memory_mib
            grown = after_out_of_memory(held, event.observed_memory_mib, self.s.config.oom_growth,
                                        self.s.cluster.largest_memory_mib()).memory_mib
            self.profiling.feedback(key, gpu.arch, grown, 0.0, t.id, oom_at=held)
        self.book.release(t.id)
        self.book.requeue(t, reason=f"its fused group of {t.group_width} ran out of memory")
        return self.s.decide()
