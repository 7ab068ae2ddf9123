"""Which rule places a study under `predict` (policies/predict.py): chosen once per
study, before its first decision, by simulating the study under each candidate rule
(`OrchestratorConfig.foresight`, the simulator, injected) and taking the one whose
simulated study ends first.

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
from dataclasses import dataclass, field

from hypersack.core.types import STATED_KEY, NodeSpec, Profile
from hypersack.grid.expand import as_key_text
from hypersack.grid.space import SearchSpace
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


def _by_end(item: tuple[str, float]) -> float:
    return item[1]


class RuleChooser:
    """The rule of each study whose policy offers candidates (`predict`)."""

    def __init__(self, s: CoreState) -> None:
        self.s = s
        self.chosen: dict[str, Choice] = {}  # by study: final once made

    def rule(self, study_id: str, space: SearchSpace, ask: Ask) -> str:
        choice = self.chosen.get(study_id)
        if choice is None:
            choice = self._choose(study_id, space, ask)
            if choice is None:
                return ask.fallback  # not yet: asked again at the study's next decision
            self.chosen[study_id] = choice
            log.info("study %s: %s", study_id, choice.describe())
        return choice.rule

    def _choose(self, study_id: str, space: SearchSpace, ask: Ask) -> Choice | None:
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
        began = time.perf_counter()
        try:
            predicted = dict(foresee(space, usable, profiles, self.s.config, candidates))
        except Exception as exc:  # a failing simulation must not hold the study back
            log.warning("study %s: simulating its candidate rules failed; %s places it",
                        study_id, fallback, exc_info=True)
            return Choice(fallback, f"the simulation failed ({type(exc).__name__}: "
                                    f"{str(exc)[:200]})")
        took = time.perf_counter() - began
        order = {name: i for i, name in enumerate(candidates)}
        best = min(candidates, key=lambda c: (predicted.get(c, math.inf), order[c]))
        if not math.isfinite(predicted.get(best, math.inf)):
            return Choice(fallback, "no candidate ended the simulated study", predicted)
        return Choice(best, f"its simulated study ends first, of {len(candidates)} rules "
                            f"simulated in {took:.2f} s", predicted)


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
