"""Which rule places a study under `predict` (policies/predict.py): chosen once per
study, before its first decision, by simulating the study under each candidate rule
(`OrchestratorConfig.foresight`, the simulator, injected) and taking the one whose
simulated study ends first.

Where the server hands the simulations to a process of its own
(`OrchestratorConfig.foresight_pool`), the event worker waits for them at most
`foresight_wait_s` and goes on with every study's events (the simulations of a
thousand trials take about a second here, of the largest studies up to
sim/foresight.BUDGET_S). Past that only the study waits: its decisions are held for its
choice at most HOLD_SHARE of the shortest it could take (HOLD_MAX_S at most), then its
fallback places it until the choice is in; a tick takes the choice in (the server ticks
when the answer comes). Without a pool (the simulator, tests) the decision waits, and
runs repeat exactly.

The simulation sees what this scheduler knows: the study's trials, the profiles of its
workloads, the nodes that take its trials where those profiles are known (at a study's
first decision, an architecture still profiling is left out), and the ratios in force.
It runs the study alone and whole on those nodes, empty: other studies' trials, later
changes of the cluster and the trials a resumed study has done are not foreseen. A
choice is final for the study; a restarted server makes it again (from the same inputs,
the same choice).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from concurrent.futures import Future, wait
from dataclasses import dataclass, field

from hypersack.core.types import STATED_KEY, NodeSpec, Profile, WorkloadKey
from hypersack.grid.expand import as_key_text
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator.config import Foresight, OrchestratorConfig
from hypersack.orchestrator.state import CoreState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    """The rule a study's decisions use, and why (`predicted_s`: each candidate's
    simulated makespan, empty where none ran)."""

    rule: str
    why: str
    predicted_s: Mapping[str, float] = field(default_factory=dict)

    def describe(self) -> str:
        if not self.predicted_s:
            return f"rule {self.rule}: {self.why}"
        ends = ", ".join(f"{name} {s:.0f} s" if math.isfinite(s) else f"{name} did not end"
                         for name, s in sorted(self.predicted_s.items(), key=_by_end))
        return f"rule {self.rule}: {self.why} (simulated ends: {ends})"


@dataclass(frozen=True)
class Ask:
    """What a policy with candidates (`predict`) asks: the rules to simulate, the rule
    where none is chosen, and the largest study and cluster to simulate."""

    candidates: tuple[str, ...]
    fallback: str
    max_trials: int
    max_gpus: int


# With a pool, a study's decisions wait for its choice at most this share of the
# shortest it could take (`shortest_s`), and never longer than HOLD_MAX_S: placed by
# the fallback instead, a study's first wave cost up to 11 % of its makespan (mean
# 1.4 %, over sim_makespan's 72 scenarios of seeds 0-5; scripts/sim_late_choice.py),
# and waiting costs at most the wait. Other studies' decisions never wait for it.
HOLD_SHARE = 0.01
HOLD_MAX_S = 15.0
# A simulation's answer: each candidate's makespan, and the seconds it took.
Timed = tuple[dict[str, float], float]


@dataclass
class _Running:
    """A study's simulations under way in the pool."""

    future: Future[Timed]
    ask: Ask
    hold_until: float  # its decisions wait for the choice until then
    hold_s: float
    released: bool = False  # the hold is over (a tick said so)


def shortest_s(s: CoreState, study_id: str, nodes: list[NodeSpec]) -> float:
    """A lower bound of how long the study takes on these nodes: its waiting trials'
    compute work (each trial's profiled run time times its compute share, on the
    architecture where that is least) over the GPUs' compute (each its ratio's worth)."""
    space = s.spaces.get(study_id)
    if space is None:
        return 0.0
    archs = {g.arch for n in nodes for g in n.gpus}
    slots = sum(s.config.ratio(g.arch, space.settings.oversubscription)
                for n in nodes for g in n.gpus)
    counts: dict[tuple[WorkloadKey, float], int] = {}
    for tid in s.waiting.get(study_id, {}):
        t = s.trials[tid]
        left = (t.key, max(t.epochs - t.done_epochs, 0.0))
        counts[left] = counts.get(left, 0) + 1
    work = 0.0
    for (key, epochs), n in counts.items():
        times = [p.run_time_s(epochs) * p.demand.compute_pct / 100.0
                 for p in (s.profiles.get((key, a)) for a in archs) if p is not None]
        work += n * min(times, default=0.0)
    return work / slots if slots > 0 else 0.0


def _by_end(item: tuple[str, float]) -> float:
    return item[1]


class RuleChooser:
    """The rule of each study whose policy offers candidates (`predict`)."""

    def __init__(self, s: CoreState) -> None:
        self.s = s
        self.chosen: dict[str, Choice] = {}  # by study: final once made
        # Simulations under way elsewhere (`OrchestratorConfig.foresight_pool`), by study:
        # its decisions are held for a while, then placed by the fallback until one is in.
        self.pending: dict[str, _Running] = {}

    def rule(self, study_id: str, space: SearchSpace, ask: Ask) -> str:
        choice = self.chosen.get(study_id)
        if choice is None:
            choice = self._choose(study_id, space, ask)
            if choice is None:
                return ask.fallback  # not yet: asked again at the study's next decision
            self.chosen[study_id] = choice
            self.pending.pop(study_id, None)
            log.info("study %s: %s", study_id, choice.describe())
        return choice.rule

    def expect(self, space: SearchSpace) -> None:
        """A study under `predict` arrives: the pool (where there is one, and the study
        is one to simulate) is asked a trivial call, which starts its process if none
        runs, so that it is ready (its imports and compiled knapsacks loaded) by the
        study's first decision."""
        pool = self.s.config.foresight_pool
        if pool is None or self.s.config.foresight is None or adapts(space):
            return
        try:
            pool.submit(bool)
        except Exception:  # a pool that cannot start: the first decision says why
            log.debug("the simulation pool did not start", exc_info=True)

    def holding(self, study_id: str) -> bool:
        """Whether the study's decisions wait for its choice: simulated elsewhere, not
        in yet, its hold (HOLD_SHARE of its makespan's estimate) not over, and no other
        study waiting for GPUs (which would take the free ones meanwhile: a study held
        then could lose far more than the hold to their trials' run time)."""
        running = self.pending.get(study_id)
        return running is not None and not running.future.done() and \
            self.s.clock.now() < running.hold_until and \
            not any(w for sid, w in self.s.waiting.items() if sid != study_id)

    def wake_at(self) -> float | None:
        """When a study's hold ends, the earliest (None: no study is held)."""
        return min((r.hold_until for r in self.pending.values() if not r.released),
                   default=None)

    def settle(self) -> bool:
        """Take in the choices whose simulations ended, and end the holds whose time is
        over (each tick asks): whether either happened to a study with trials waiting,
        which a decision then places (by its choice, or by the fallback meanwhile)."""
        wanted = False
        now = self.s.clock.now()
        for study_id, running in list(self.pending.items()):
            if study_id not in self.s.spaces:
                del self.pending[study_id]  # gone meanwhile
                continue
            waiting = bool(self.s.waiting.get(study_id))
            if running.future.done():
                del self.pending[study_id]
                self.chosen[study_id] = choice = self._answer(study_id, running.future,
                                                              running.ask)
                log.info("study %s: %s", study_id, choice.describe())
                wanted = wanted or waiting
            elif not running.released and now >= running.hold_until:
                running.released = True
                log.info("study %s: its choice is not in after %.2f s; %s places it until "
                         "it is", study_id, running.hold_s, running.ask.fallback)
                wanted = wanted or waiting
        return wanted

    def describe(self, study_id: str) -> str | None:
        """The study's choice, or that it is being made (None: neither)."""
        choice = self.chosen.get(study_id)
        if choice is not None:
            return choice.describe()
        running = self.pending.get(study_id)
        if running is None:
            return None
        if self.holding(study_id):
            return ("its candidate rules are being simulated; its trials wait for the "
                    f"choice (at most {running.hold_s:.2f} s, {HOLD_SHARE:.0%} of the "
                    "shortest its study could take)")
        return (f"its candidate rules are being simulated; {running.ask.fallback} "
                "places it until the choice is in")

    def _choose(self, study_id: str, space: SearchSpace, ask: Ask) -> Choice | None:
        running = self.pending.get(study_id)
        if running is not None:
            return self._answer(study_id, running.future, ask) if running.future.done() \
                else None
        fallback, candidates = ask.fallback, ask.candidates
        foresee = self.s.config.foresight
        if foresee is None:
            return Choice(fallback, "no simulator in this process")
        if adapts(space):
            return Choice(fallback, "which trials run depends on their results (adaptive "
                                    "search or a pruner), so the study is not simulated")
        trial_ids = self.s.by_study.get(study_id, [])
        if len(trial_ids) > ask.max_trials:
            return Choice(fallback, f"{len(trial_ids)} trials, more than predict's "
                                    f"max_trials ({ask.max_trials}) simulates")
        inputs = study_inputs(self.s, study_id)
        if inputs is None:
            return None  # profiles first: asked again at the next decision
        usable, profiles = inputs
        gpus = sum(len(n.gpus) for n in usable)
        if gpus > ask.max_gpus:
            return Choice(fallback, f"{gpus} GPUs, more than predict's max_gpus "
                                    f"({ask.max_gpus}) simulates")
        args = (foresee, space, usable, profiles, self.s.config.simulated(),
                tuple(candidates))
        pool = self.s.config.foresight_pool
        future: Future[Timed] = Future()
        if pool is None:  # here and now: the decision waits (repeatable runs)
            try:
                future.set_result(timed(*args))
            except Exception as exc:
                future.set_exception(exc)
            return self._answer(study_id, future, ask)
        try:
            future = pool.submit(timed, *args)
        except Exception as exc:  # no process to run it in: the study must not wait
            future.set_exception(exc)
            return self._answer(study_id, future, ask)
        wait([future], timeout=self.s.config.foresight_wait_s)
        if future.done():
            return self._answer(study_id, future, ask)
        hold_s = min(HOLD_MAX_S, HOLD_SHARE * shortest_s(self.s, study_id, usable))
        self.pending[study_id] = _Running(future, ask, self.s.clock.now() + hold_s, hold_s)
        log.info("study %s: its %d candidate rules are simulated in the background; its "
                 "trials wait for the choice at most %.2f s, then %s places them until it "
                 "is in", study_id, len(candidates), hold_s, fallback)
        return None

    def _answer(self, study_id: str, future: Future[Timed], ask: Ask) -> Choice:
        fallback, candidates = ask.fallback, ask.candidates
        try:
            predicted, took = future.result()
        except Exception as exc:  # a failing simulation must not hold the study back
            log.warning("study %s: simulating its candidate rules failed; %s places it",
                        study_id, fallback, exc_info=True)
            return Choice(fallback, f"the simulation failed ({type(exc).__name__}: "
                                    f"{str(exc)[:200]})")
        order = {name: i for i, name in enumerate(candidates)}
        best = min(candidates, key=lambda c: (predicted.get(c, math.inf), order[c]))
        if not math.isfinite(predicted.get(best, math.inf)):
            return Choice(fallback, "no candidate ended the simulated study", predicted)
        return Choice(best, f"its simulated study ends first, of {len(candidates)} rules "
                            f"simulated in {took:.2f} s", predicted)


def timed(foresee: Foresight, space: SearchSpace, nodes: list[NodeSpec],
          profiles: list[Profile], config: OrchestratorConfig,
          candidates: tuple[str, ...]) -> Timed:
    """`foresee`'s makespans and the time it took, where it runs (here, or the pool's
    process: a module-level function, so that it pickles)."""
    began = time.perf_counter()
    predicted = dict(foresee(space, nodes, profiles, config, candidates))
    return predicted, time.perf_counter() - began


def adapts(space: SearchSpace) -> bool:
    """Whether which trials run depends on their results (adaptive search or a pruner):
    such a study is not simulated."""
    return space.search.adaptive or space.pruner is not None


def study_inputs(s: CoreState, study_id: str) -> tuple[list[NodeSpec], list[Profile]] | None:
    """What a simulation of the study sees: the open nodes that take its trials where
    every workload of it has its profile (where one failed the trials never run, and
    where one is still on its way no decision places there either), and every profile
    of its workloads there, fused widths' too. None: no such node yet."""
    trial_ids = s.by_study.get(study_id, [])
    keys = {s.trials[t].key for t in trial_ids}
    usable = [n.spec for n in s.nodes_for(study_id, s.cluster.open_nodes())
              if all((k, g.arch) in s.profiles for k in keys for g in n.spec.gpus)]
    if not usable:
        return None
    archs = {g.arch for n in usable for g in n.gpus}
    profiles = [p for (key, arch), p in s.profiles.items()
                if arch in archs and key.model_copy(update={"fusion_width": 1}) in keys]
    # A stated demand's workload key names its study (`stated_by`), and the simulator
    # submits the study afresh, as the first of its name: its profiles are renamed so.
    space = s.spaces.get(study_id)
    if space is not None:
        mine, simulated = as_key_text(study_id), as_key_text(f"{space.name}-1")
        if mine != simulated:
            profiles = [_renamed(p, mine, simulated) for p in profiles]
    return usable, profiles


def _renamed(p: Profile, mine: str, simulated: str) -> Profile:
    params = p.key.params
    if (STATED_KEY, mine) not in params:
        return p
    key = p.key.model_copy(update={"params": tuple(
        (k, simulated if (k, v) == (STATED_KEY, mine) else v) for k, v in params)})
    return p.model_copy(update={"key": key})
