"""The simulator's learned sharing level (a mixin of Simulation): a study's arrival
(work new to the learner goes at the configured ratio; each architecture reconsidered
by foresight), and the foresight that simulates the study under candidate ratios, as
the server's orchestrator/learned.py does."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from hypersack.core.types import ClusterSpec, Profile
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator.events import StudySubmitted
from hypersack.orchestrator.orchestrator import Orchestrator, OrchestratorConfig
from hypersack.orchestrator.sharing import RatioLearner
from hypersack.orchestrator.studies import submitted_workloads


class Learning:
    """What Simulation gives it: its learner (None: the ratios stay fixed), the
    orchestrator whose ratios it sets, the study and cluster simulated, and the
    profiles the scheduler believes. `ratio_moves`: (time, architecture, new ratio)."""

    learner: RatioLearner | None
    orchestrator: Orchestrator
    config: OrchestratorConfig
    space: SearchSpace
    cluster: ClusterSpec
    _believed: list[Profile]
    ratio_moves: list[tuple[float, str, float]]

    def _moved(self, now: float, moves: Mapping[str, float]) -> bool:
        """Note the moves and put the learner's ratios in force; whether any."""
        self.ratio_moves += [(now, arch, r) for arch, r in moves.items()]
        if moves and self.learner is not None:
            self.orchestrator.s.set_ratios(self.learner.ratios)
        return bool(moves)

    def _arriving(self, ev: StudySubmitted, running: Mapping[str, Mapping[str, float]],
                  now: float) -> None:
        """Before the study's first placement (`running`: the trials running per
        architecture, by workload): work new to the learner goes at the configured
        ratio (RatioLearner.arriving, as the server's learner does)."""
        if self.learner is not None:
            pending = sum(len(w) for w in self.orchestrator.s.waiting.values())
            self._moved(now, self.learner.arriving(
                submitted_workloads(ev), pending,
                {arch: sum(mix.values()) for arch, mix in running.items()},
                ev.space.settings.oversubscription))

    def _arrived(self, mixes: Mapping[str, Mapping[str, float]], now: float) -> bool:
        """This study arrived (`mixes`: the trials running per architecture, by
        workload): the learner reconsiders each architecture by foresight; whether a
        ratio moved."""
        learner = self.learner
        if learner is None:
            return False
        learner.forget_foresight()
        moves = {}
        for arch in sorted(learner.ratios):
            new = learner.reconsider(arch, mixes.get(arch))
            if new is not None:
                moves[arch] = new
        return self._moved(now, moves)

    def _weigh(self, arch: str, candidates: Sequence[float]) -> Mapping[float, float] | None:
        """The learner's foresight: this study simulated whole under each candidate
        ratio of `arch` (the others at the learner's), slowed as its fits say, placed
        by the rule this study's decisions use."""
        from hypersack.sim.foresight import foresee_ratios  # it builds on the simulator

        learner = self.learner
        if learner is None:
            return None
        policy = self.config.policy or self.space.settings.policy
        if policy == "predict":  # the rule chosen for this study, the first submitted
            studies = self.orchestrator.studies()
            chosen = self.orchestrator.rule_choice(studies[0].id) if studies else None
            policy = chosen.rule if chosen is not None else "eft"
        return foresee_ratios(self.space, self.cluster.nodes, self._believed, self.config,
                              policy, arch, candidates, learner.ratios, learner.fits,
                              learner.workload_fits, budget_s=math.inf)  # as on any machine
