"""The simulator as the scheduler's foresight: a study run under each candidate rule
(`OrchestratorConfig.foresight`), for the default policy `predict` to take the rule
that ends it first (orchestrator/foresight.py); and under each candidate ratio of one
architecture with the ratio learner's fits as the interference
(`OrchestratorConfig.ratio_foresight`), for the learner to step toward the ratio that
ends it first (orchestrator/sharing.py)."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TypeVar

from hypersack.core.types import ClusterSpec, NodeSpec, Profile
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator.config import OrchestratorConfig
from hypersack.orchestrator.fits import Fit
from hypersack.policies import kernels
from hypersack.sim.interference import FittedInterference
from hypersack.sim.simulator import Simulation

# The simulated orchestrators log as the real one does (nodes joining, the study
# submitted): kept out of the server's log while they run. Only the thread making the
# choice runs orchestrator code, so quieting these loggers hides nothing else.
_QUIET = ("hypersack.orchestrator", "hypersack.sim")
# Rules that run pack's knapsacks: simulated only while they run compiled. As plain
# Python (numba missing, or compiling in the server's background for a few seconds after
# it starts) each of their simulated decisions may take up to its 500 ms cap, and a
# simulated study makes hundreds.
PACKING = ("auto", "pack")
# The wall time all candidates may take together (in the server's simulation process;
# predict's fallback places the study until they are in): a candidate not started
# within it counts as not ending. Far above what the bounds on trials and GPUs let a
# simulation take (predict.MAX_TRIALS).
BUDGET_S = 10.0
# The wall time the learner's candidate ratios may take together (in the server's
# simulation process; the learner's decision holds until they are in, at most every
# third per architecture): candidates past it count as not ending. The learner puts the
# ratio in force and a step either side first.
RATIO_BUDGET_S = 2.0
K = TypeVar("K", str, float)  # a candidate: a rule's name, or a ratio


def foresee(space: SearchSpace, nodes: Sequence[NodeSpec], profiles: Sequence[Profile],
            config: OrchestratorConfig, candidates: Sequence[str]) -> Mapping[str, float]:
    """Each candidate rule's simulated makespan for the study (infinite where the
    simulated study did not end with every trial completed, or where the rule was not
    simulated: past BUDGET_S, or a PACKING rule without its compiled knapsacks)."""
    # Fixed ratios (the ones in force), each candidate's rule.
    runs = {name: (name, dict(config.oversubscription)) for name in candidates}
    return _makespans(space, nodes, profiles, config, runs, None, BUDGET_S)


def foresee_ratios(space: SearchSpace, nodes: Sequence[NodeSpec], profiles: Sequence[Profile],
                   config: OrchestratorConfig, policy: str, arch: str,
                   candidates: Sequence[float], ratios: Mapping[str, float],
                   fits: Mapping[str, Fit], workload_fits: Mapping[str, Mapping[str, Fit]],
                   budget_s: float = RATIO_BUDGET_S) -> Mapping[float, float]:
    """Each candidate ratio's simulated makespan for the study: `arch` at the candidate,
    the others at `ratios`, placed by `policy`, slowed as the fits say
    (FittedInterference). Infinite where the simulated study did not end with every
    trial completed, or where the candidate was not simulated (past `budget_s` of wall
    time, or a PACKING rule without its compiled knapsacks)."""
    model = FittedInterference(fits=dict(fits),
                               workload_fits={a: dict(w) for a, w in workload_fits.items()})
    runs = {ratio: (policy, {**ratios, arch: ratio}) for ratio in candidates}
    return _makespans(space, nodes, profiles, config, runs, model, budget_s)


def _makespans(space: SearchSpace, nodes: Sequence[NodeSpec], profiles: Sequence[Profile],
               config: OrchestratorConfig, runs: Mapping[K, tuple[str, dict[str, float]]],
               interference: FittedInterference | None, budget_s: float) -> dict[K, float]:
    """Each run's (rule, ratios) simulated makespan, in order, within `budget_s` of wall
    time: no learning and no nested foresight in the simulated orchestrators."""
    cluster = ClusterSpec(nodes=tuple(nodes))
    out: dict[K, float] = {}
    began = time.perf_counter()
    with _quiet():
        for key, (policy, ratios) in runs.items():
            if time.perf_counter() - began > budget_s or \
                    (policy in PACKING and kernels.compiled("pairs_row") is None):
                out[key] = math.inf  # not simulated
                continue
            run = replace(config.simulated(), policy=policy, oversubscription=ratios,
                          learn_ratio=False)
            result = Simulation(space, cluster, profiles, config=run,
                                interference=interference).run()
            ended = not result.stuck and result.completed == result.trials
            out[key] = result.makespan_s if ended else math.inf
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in _QUIET]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)
