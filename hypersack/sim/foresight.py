"""The simulator as the scheduler's foresight (`OrchestratorConfig.foresight`): a study
run under each candidate rule, on the given nodes with the given profiles, for the
default policy `predict` to take the rule that ends it first
(orchestrator/foresight.py)."""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace

from hypersack.core.types import ClusterSpec, NodeSpec, Profile
from hypersack.grid.space import SearchSpace
from hypersack.orchestrator.config import OrchestratorConfig
from hypersack.sim.simulator import Simulation

# The simulated orchestrators log as the real one does (nodes joining, the study
# submitted): kept out of the server's log while they run. Only the thread making the
# choice runs orchestrator code, so quieting these loggers hides nothing else.
_QUIET = ("hypersack.orchestrator", "hypersack.sim")


def foresee(space: SearchSpace, nodes: Sequence[NodeSpec], profiles: Sequence[Profile],
            config: OrchestratorConfig, candidates: Sequence[str]) -> Mapping[str, float]:
    """Each candidate rule's simulated makespan for the study (infinite where the
    simulated study did not end with every trial completed)."""
    cluster = ClusterSpec(nodes=tuple(nodes))
    out: dict[str, float] = {}
    with _quiet():
        for name in candidates:
            # Fixed ratios (the ones in force), no learning and no nested foresight.
            run = replace(config, policy=name, foresight=None, learn_ratio=False)
            result = Simulation(space, cluster, profiles, config=run).run()
            ended = not result.stuck and result.completed == result.trials
            out[name] = result.makespan_s if ended else math.inf
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
