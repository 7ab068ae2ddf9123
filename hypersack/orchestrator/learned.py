"""The learned sharing level on the server (issue 38): running trials' slowdown sampled
from their progress, the learner's ratios (orchestrator/sharing.py) put in force, and
kept in the store so that a restarted server decides as this one would.

A sample is one plain (unfused) trial's reported seconds per iteration over its solo
profile's, with its GPU's placed load (the sum of its trials' solo compute shares) and
trial count, taken only when that GPU's set of trials did not change during the window
the report covers (else the load it saw is not the load now), and at most one per GPU
every `learn_sample_every_s` seconds. Each trial gets at most its share of its GPU's
samples: one per `learn_sample_every_s` times the trials on that GPU. A trial's
program reports its own iteration times, so a trial that reports often (or lies)
would otherwise take the GPU's samples that its neighbours' reports should have given,
and its owner's numbers would outweigh theirs in the shared fit. Samples gathered
while a batch runs reach the learner only once the batch is committed: an undone event
leaves none. The learner decides at most once per `learn_decide_every_s` per
architecture (its fit is the costly part), and a moved ratio is kept in the store
before it is put in force; if the store refuses, the move is taken back, so memory and
store agree.

The learned ratio is the server's: a study's own `settings.oversubscription` still wins
for that study, and trials placed under an older ratio keep running.

Foresight (`ratio_foresight`, the simulator, injected; `learn_foresight`): the learner's
target is the candidate ratio under which the study with the most trials pending,
simulated whole with the learner's fits as the interference, ends first (not studies
that adapt to their results, nor past FORESIGHT_MAX_TRIALS trials or
FORESIGHT_MAX_GPUS GPUs; there the progress model sets it). When that study changes (one
arrives with more pending, or the one simulated has none left), each architecture is
reconsidered for the new one at its next chance, without waiting for new samples.
With `foresight_pool` (the server's simulation process) the event worker waits for the
simulations at most `foresight_wait_s`: past that the decision holds (no step) until
they are in, and is taken at the next batch after.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any

from hypersack.core.types import TrialRecord, TrialState
from hypersack.orchestrator.config import RatioForesight
from hypersack.orchestrator.events import TrialProgress
from hypersack.orchestrator.fits import believed
from hypersack.orchestrator.foresight import adapts, study_inputs
from hypersack.orchestrator.journal import journaled
from hypersack.orchestrator.levels import SharingLevel, WorkloadFit
from hypersack.orchestrator.sharing import RatioLearner, Weighing
from hypersack.orchestrator.state import CoreState
from hypersack.policies.base import COMPUTE_SCALE

log = logging.getLogger(__name__)

SETTING = "sharing.learned"
# A slowdown outside these bounds is a broken measurement (or a lie), not sharing.
MIN_SLOWDOWN = 0.5
MAX_SLOWDOWN = 50.0
# The largest study and cluster the learner's foresight simulates (about 10 candidates
# a time, in the server's simulation process or here; sim/foresight.RATIO_BUDGET_S caps
# their wall time).
FORESIGHT_MAX_TRIALS = 1000
FORESIGHT_MAX_GPUS = 256
# Foresight's study changes to another with trials pending only once that one has this
# many times as many pending (or the study simulated has none left).
SUBJECT_SWITCH = 1.25
# ... looked for at most once per this many seconds, and whenever a study was submitted.
SUBJECT_EVERY_S = 1.0


# A learner's decision waits for its simulations at most this long (on the server's
# clock); past it the decision is taken without them, as if they had failed.
WEIGH_GIVE_UP_S = 60.0


@dataclass(frozen=True)
class _Weighing:
    """An architecture's simulations under way in the pool."""

    candidates: tuple[float, ...]
    future: Future[Mapping[float, float]]
    since: float


class LearnedSharing:
    def __init__(self, s: CoreState) -> None:
        self.s = s
        config = s.config
        self.configured = dict(config.oversubscription)
        self.learner: RatioLearner | None = None
        if config.learn_ratio:
            high = max([config.learn_ratio_max, *self.configured.values()])
            low = min([1.0, config.default_ratio, *self.configured.values()])
            self.learner = RatioLearner(self.configured, low=low, high=high,
                                        min_samples=config.learn_min_samples,
                                        every=config.learn_min_samples,
                                        window=10 * config.learn_min_samples,
                                        by_workload=config.learn_by_workload)
            if config.learn_foresight and config.ratio_foresight is not None:
                self.learner.weigh = self._weigh
        # The rule a study's decisions use (its policy's, or predict's choice): set by
        # the orchestrator; None: the configured policy's name.
        self.rule_of: Callable[[str], str] | None = None
        # The batch's samples; an undone event's go with it (the journal truncates).
        self._pending = _Samples()
        j = s.journal
        # Per GPU: when a trial last came or went (first heard of, after a restart), and
        # when it was last sampled; per running trial, when it last gave a sample.
        self._changed: dict[tuple[str, int], float] = journaled(j)
        self._sampled: dict[tuple[str, int], float] = journaled(j)
        self._trial_sampled: dict[str, float] = journaled(j)
        self._decided: dict[str, float] = {}
        # Foresight's study (the first of `_subjects`) as of the last batch, and the
        # architectures to reconsider for it at their next chance.
        self._subject: str | None = None
        self._reconsider: set[str] = set()
        self._watched: tuple[int, float] = (-1, -math.inf)  # (studies known, when)
        # With a pool (OrchestratorConfig.foresight_pool): each architecture's simulation
        # under way there (its candidates, and the answer to come), and the decisions
        # held for one (whether each was a reconsideration), taken again once it is in.
        self._weighing: dict[str, _Weighing] = {}
        self._held: dict[str, bool] = {}
        self._waiting_for: str | None = None  # the decision just made is held for it
        self._saved_at = -math.inf

    # ---------------------------------------------------------------- samples
    def sample(self, trial_id: str, event: TrialProgress) -> None:
        """Note a running trial's reported iteration time, if it makes a sample."""
        if self.learner is None or event.iter_time_s <= 0 or self.s.config.exclusive:
            return
        t = self.s.trials.get(trial_id)
        if t is None or t.group or t.node is None or t.gpu_index is None:
            return  # a fused member's time is its group's: not one trial's slowdown
        gpu = self.s.cluster.gpu(t.node, t.gpu_index)
        if gpu is None or trial_id not in gpu.trials:
            return
        profile = self.s.profiles.get((t.key, gpu.arch))
        if profile is None or profile.iter_time_s <= 0 or profile.source.startswith("stated"):
            return  # no solo time measured on this architecture to compare with
        where = (t.node, t.gpu_index)
        now = self.s.clock.now()
        changed = self._changed.get(where)
        if changed is None:
            self._changed[where] = now
            return
        if now - changed < max(event.iter_window_s, self.s.config.learn_settle_s):
            # Its GPU changed within the window the report covers, or too lately for
            # the trials that came to be past their start (imports, a CUDA context).
            return
        every = self.s.config.learn_sample_every_s
        if now - self._sampled.get(where, -math.inf) < every or \
                now - self._trial_sampled.get(trial_id, -math.inf) < every * len(gpu.trials):
            return  # the GPU's slot is taken, or this trial had its share of them
        slowdown = event.iter_time_s / profile.iter_time_s
        if not MIN_SLOWDOWN <= slowdown <= MAX_SLOWDOWN:
            return
        self._sampled[where] = now
        self._trial_sampled[trial_id] = now
        if self.s.journal.open:
            self.s.journal.record(self._pending, None, len(self._pending))
        self._pending.append((gpu.arch, gpu.used_compute / COMPUTE_SCALE, len(gpu.trials),
                              slowdown, t.key.model))

    def transition(self, old: TrialRecord, new: TrialRecord) -> None:
        """A trial came to a GPU or left it: that GPU's load changed now (a listener of
        the book's transitions)."""
        if self.learner is None or (old.state == new.state and
                                    (old.node, old.gpu_index) == (new.node, new.gpu_index)):
            return  # learning off (nothing reads it), or nothing came or went
        if new.state != TrialState.RUNNING:
            self._trial_sampled.pop(new.id, None)  # its attempt ended: no share to keep
        now = self.s.clock.now()
        for t in (old, new):
            if t.state == TrialState.RUNNING and t.node is not None and \
                    t.gpu_index is not None:
                self._changed[t.node, t.gpu_index] = now

    # ---------------------------------------------------------------- decisions
    def commit(self) -> None:
        """After a committed batch: hand its samples to the learner, and let it decide
        for each architecture that is due. A moved ratio is stored, then put in force.
        With foresight, a change of the study it simulates (a study arrived, or the one
        simulated is done) has each architecture reconsidered at its next chance."""
        learner = self.learner
        if learner is None:
            return
        if learner.weigh is not None:
            self._watch_subject(learner)
        if not self._pending:
            if self._reconsider or self._held:
                self._decide_all([], self.s.clock.now())
            return
        pending = list(self._pending)
        self._pending.clear()
        archs = []
        for arch, load, n, slowdown, workload in pending:
            if arch not in learner.ratios:
                # An architecture the configuration does not name runs at the default.
                learner.ratios[arch] = learner.configured[arch] = self._configured(arch)
            if learner.add(arch, load, n, slowdown, workload) and arch not in archs:
                archs.append(arch)
        now = self.s.clock.now()
        saved = self._decide_all(archs, now)
        if not saved and now - self._saved_at >= self.s.config.learn_decide_every_s:
            # The samples since the last decision, kept once in a while too: a restart
            # loses at most this interval's.
            self._save(now)

    def arriving(self, studies: Sequence[tuple[Mapping[str, float], Mapping[str, float]]]
                 ) -> None:
        """Studies about to be submitted (each its trials by workload, and the ratios it
        sets itself), before the batch that places their first trials: one of work new
        to the learner, larger than what runs on an architecture and waits, goes there
        at the configured ratio (RatioLearner.arriving), unless it packs that
        architecture at its own ratio. Stored, then in force; what cannot be stored is
        not made."""
        learner = self.learner
        if learner is None or not studies:
            return
        pending = sum(len(w) for w in self.s.waiting.values())
        running: dict[str, float] = {}
        for node in self.s.cluster:
            for gpu in node.gpus.values():
                running[gpu.arch] = running.get(gpu.arch, 0.0) + len(gpu.trials)
        for workloads, own in studies:
            before = dict(learner.ratios), dict(learner.moves)
            moved = learner.arriving(workloads, pending, running, own)
            if not moved:
                continue
            if not self._save(self.s.clock.now()):
                learner.ratios, learner.moves = before
                continue
            for arch, ratio in moved.items():
                log.info("%s: oversubscription ratio %g -> %g, the configured one: the "
                         "study arriving is mostly of workloads not yet seen there (%s)",
                         arch, before[0][arch], ratio,
                         ", ".join(sorted(w[:64] for w in workloads)[:4]))
            self.s.set_ratios(self._in_force())

    def _decide_all(self, archs: list[str], now: float) -> bool:
        """Decide for each architecture in `archs` that is due, and reconsider each one
        waiting for it, at most once per `learn_decide_every_s` each; whether the
        learner's state was stored."""
        learner = self.learner
        assert learner is not None
        every = self.s.config.learn_decide_every_s
        saved = False
        for arch in dict.fromkeys([*archs, *sorted(self._reconsider), *sorted(self._held)]):
            running = self._weighing.get(arch)
            if running is not None and not running.future.done() and \
                    now - running.since < WEIGH_GIVE_UP_S:
                continue  # its simulation is not in: decided once it is
            held = arch in self._held
            again = arch in self._reconsider or self._held.pop(arch, False)
            if not held and (not (again or learner.due(arch)) or
                             now - self._decided.get(arch, -math.inf) < every):
                continue
            self._decided[arch] = now
            self._reconsider.discard(arch)
            before = dict(learner.ratios), dict(learner.moves)
            mix = self._mix(arch) if learner.by_workload else None
            moved = learner.reconsider(arch, mix) if again and not learner.due(arch) \
                else learner.decide(arch, mix)
            if self._waiting_for == arch:  # handed to the pool, not in yet: held
                self._held[arch] = again
                self._waiting_for = None
            saved = self._save(now)
            if not saved:
                learner.ratios, learner.moves = before
                continue
            if moved is not None:
                log.info("%s: oversubscription ratio %g -> %g, learned from %d samples%s",
                         arch, before[0][arch], moved, len(learner.samples[arch]),
                         " (reconsidered for a new study)" if again else "")
                self.s.set_ratios(self._in_force())
                self.s.decide_again = True  # the next tick packs with it
        return saved

    def _watch_subject(self, learner: RatioLearner) -> None:
        """Foresight simulates `_subject` first: the study with the most trials pending,
        kept until it has none or another has SUBJECT_SWITCH times as many (studies
        of about the same size do not take turns). When it changes, the learner's grids
        of the old one are forgotten, and each architecture is reconsidered for the new."""
        now, count = self.s.clock.now(), len(self.s.spaces)
        if count == self._watched[0] and now - self._watched[1] < SUBJECT_EVERY_S:
            return  # no study came: looked at once a second (a sort of the studies)
        self._watched = (count, now)
        best = next(self._subjects(), None)
        current = self._subject
        if current is not None and self._eligible(current) and best is not None and \
                len(self.s.waiting[best]) < SUBJECT_SWITCH * len(self.s.waiting[current]):
            best = current
        if best == current:
            return
        self._subject = best
        learner.forget_foresight()
        self._weighing.clear()  # simulations of the old study: of no use now
        if best is not None:
            self._reconsider.update(a for a in learner.ratios if learner.can_foresee(a))

    def _eligible(self, sid: str) -> bool:
        """Whether foresight may simulate the study: trials pending, not one that adapts
        to its results, not past FORESIGHT_MAX_TRIALS."""
        space = self.s.spaces.get(sid)
        return bool(self.s.waiting.get(sid)) and space is not None and not adapts(space) \
            and len(self.s.by_study.get(sid, ())) <= FORESIGHT_MAX_TRIALS

    def _subjects(self) -> Iterator[str]:
        """The studies foresight may simulate, the one with the most trials pending first."""
        waiting = sorted(((len(w), sid) for sid, w in self.s.waiting.items() if w),
                         reverse=True)
        return (sid for _, sid in waiting if self._eligible(sid))

    def _weigh(self, arch: str, candidates: Sequence[float]) -> Mapping[float, float] | None:
        """The learner's foresight: the study with the most trials pending, simulated
        under each candidate ratio of `arch` (None: no study to simulate there)."""
        foresee, learner = self.s.config.ratio_foresight, self.learner
        if foresee is None or learner is None:
            return None
        first = [self._subject] if self._subject is not None and \
            self._eligible(self._subject) else []
        for sid in dict.fromkeys([*first, *self._subjects()]):
            space = self.s.spaces[sid]
            inputs = study_inputs(self.s, sid)
            if inputs is None:
                continue
            nodes, profiles = inputs
            if arch not in {g.arch for n in nodes for g in n.gpus} or \
                    sum(len(n.gpus) for n in nodes) > FORESIGHT_MAX_GPUS:
                continue
            policy = self.rule_of(sid) if self.rule_of is not None else \
                (self.s.config.policy or space.settings.policy)
            args = (space, nodes, profiles, self.s.config.simulated(), policy, arch,
                    tuple(candidates), dict(learner.ratios), dict(learner.fits),
                    {a: dict(w) for a, w in learner.workload_fits.items()})
            try:
                return self._weighed(arch, sid, foresee, args)
            except Weighing:
                raise
            except Exception:  # a failing simulation leaves the progress model's target
                log.warning("%s: simulating study %s under candidate ratios failed", arch,
                            sid, exc_info=True)
                return None
        return None

    def _weighed(self, arch: str, sid: str, foresee: RatioForesight,
                 args: tuple[Any, ...]) -> Mapping[float, float]:
        """The simulation's answer: here and now without a pool; with one, its answer
        once in (Weighing until then: the event worker waits for it at most
        foresight_wait_s, and the learner's decision holds meanwhile)."""
        pool = self.s.config.foresight_pool
        if pool is None:
            return foresee(*args)
        candidates, now = args[6], self.s.clock.now()
        running = self._weighing.get(arch)
        if running is not None and not running.future.done() and \
                now - running.since >= WEIGH_GIVE_UP_S:
            # Stuck (the process should answer within RATIO_BUDGET_S and a run): decided
            # without it, and nothing more is queued behind it until it answers.
            raise TimeoutError(f"no answer from the simulation process in "
                               f"{now - running.since:.0f} s")
        if running is not None and running.candidates == candidates and \
                running.future.done():
            del self._weighing[arch]
            return running.future.result()
        if running is None or running.candidates != candidates:
            future = pool.submit(foresee, *args)
            wait([future], timeout=self.s.config.foresight_wait_s)
            if future.done():
                self._weighing.pop(arch, None)
                return future.result()
            self._weighing[arch] = _Weighing(candidates, future, now)
            log.info("%s: study %s is simulated under %d candidate ratios in the "
                     "background; the learner decides once that is in", arch, sid,
                     len(candidates))
        self._waiting_for = arch
        raise Weighing

    def _mix(self, arch: str) -> dict[str, float]:
        """The plain trials running on the architecture's GPUs now, by workload."""
        mix: dict[str, float] = {}
        for node in self.s.cluster:
            for gpu in node.gpus.values():
                if gpu.arch != arch:
                    continue
                for tid in gpu.trials:
                    t = self.s.trials.get(tid)
                    if t is not None and not t.group:
                        mix[t.key.model] = mix.get(t.key.model, 0.0) + 1.0
        return mix

    def _configured(self, arch: str) -> float:
        return self.configured.get(arch, self.s.config.default_ratio)

    def _in_force(self) -> dict[str, float]:
        assert self.learner is not None
        return dict(self.learner.ratios)

    def _save(self, now: float) -> bool:
        assert self.learner is not None
        self._saved_at = now
        state = {**self.learner.state(), "configured": {
            a: self._configured(a) for a in self.learner.ratios}}
        try:
            self.s.store.put_setting(SETTING, json.dumps(state))
        except Exception as exc:
            log.warning("the learned sharing level could not be stored (%s); it stays "
                        "where it was", str(exc)[:200])
            return False
        return True

    def restore(self) -> None:
        """Take back what the store kept (a restart): the ratios in force and the
        samples behind them, for architectures configured as they were."""
        if self.learner is None:
            return
        try:
            text = self.s.store.get_setting(SETTING)
            state = json.loads(text) if text else None
        except (ValueError, RecursionError):
            log.warning("the stored learned sharing level does not parse; learning afresh")
            return
        if not isinstance(state, dict):
            return
        configured = {**self.configured}
        saved = state.get("configured")
        for arch in saved if isinstance(saved, dict) else {}:
            if arch not in self.learner.ratios and arch not in configured:
                self.learner.ratios[arch] = configured[arch] = \
                    self.learner.configured[arch] = self._configured(arch)
        self.learner.load(state, configured)
        self.s.set_ratios(self._in_force())

    # ---------------------------------------------------------------- views
    def levels(self, archs: list[str] | None = None) -> list[SharingLevel]:
        """The ratio of each architecture named (default: the cluster's) and of each the
        learner has samples of."""
        learner = self.learner
        named = self.s.cluster.archs_of(list(self.s.cluster)) if archs is None else archs
        names = sorted(set(named) | {a for a, q in (learner.samples if learner else {}).items()
                                     if q})
        out = []
        for arch in names:
            configured = self._configured(arch)
            if learner is None:
                out.append(SharingLevel(arch, configured, self.s.config.ratio(arch, {}),
                                        False))
                continue
            f = learner.fits.get(arch)
            own = tuple(WorkloadFit(w, g.samples, g.contention,
                                    g.saturation_pct if believed(g) else 0.0, g.queued)
                        for w, g in sorted(learner.workload_fits.get(arch, {}).items()))
            out.append(SharingLevel(
                arch, configured, learner.ratios.get(arch, configured), True,
                len(learner.samples.get(arch, ())), learner.min_samples,
                f.contention if f else 0.0, f.saturation_pct if f else 0.0,
                learner.moves.get(arch, 0), f.queued if f else 1.0, own,
                seen.describe() if (seen := learner.foreseen.get(arch)) else ""))
        return out


class _Samples(list[tuple[str, float, int, float, str]]):
    """Samples (arch, load, trials, slowdown, workload) of the batch being handled; the journal
    undoes an append by truncating back to the length before it."""

    def save(self) -> int:
        return len(self)

    def restore(self, length: int) -> None:
        del self[length:]
