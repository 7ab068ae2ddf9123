"""The orchestrator's server-wide settings (a study's own settings override the ratios
and the policy)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hypersack.core.types import NodeSpec, Profile, UserShare

if TYPE_CHECKING:
    from hypersack.grid.space import SearchSpace

# (space, nodes, profiles, config, candidates) -> predicted makespan per candidate
Foresight = Callable[["SearchSpace", Sequence[NodeSpec], Sequence[Profile],
                      "OrchestratorConfig", Sequence[str]], Mapping[str, float]]

# (space, nodes, profiles, config, policy, architecture, candidate ratios, the ratios
# in force, the learner's fits by architecture, and by architecture and workload)
# -> predicted makespan per candidate ratio
RatioForesight = Callable[["SearchSpace", Sequence[NodeSpec], Sequence[Profile],
                           "OrchestratorConfig", str, str, Sequence[float],
                           Mapping[str, float], Mapping[str, Any],
                           Mapping[str, Mapping[str, Any]]], Mapping[float, float]]

DEFAULT_RATIOS: dict[str, float] = {"A100": 3.0, "H100": 2.5}
_DEFAULT_SHARE = UserShare()


@dataclass(frozen=True)
class OrchestratorConfig:
    """Server-wide settings; a study's own settings override the ratios and the policy."""

    oversubscription: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_RATIOS))
    default_ratio: float = 1.0
    heartbeat_timeout_s: float = 30.0
    restore_grace_s: float = 30.0  # extra time for the nodes of a restarted server
    # A node's heartbeats list what it runs (and the trials whose exits it has yet to see
    # acknowledged): a trial held RUNNING there that its heartbeats leave out for longer
    # than this, with no exit, goes back to PENDING for its next attempt (its launch was
    # lost, or its agent restarted without it).
    missing_grace_s: float = 15.0
    exclusive: bool = False  # one trial per GPU: the baseline the paper compares against
    fusion: bool = True  # False: no fused groups for any study (packing alone)
    oom_growth: float = 1.5  # memory demand factor after an out-of-memory death
    # Feedback: a profile's memory demand becomes a trial's observed peak plus this share
    # when the peak exceeds it; its compute demand becomes the observed utilization when
    # that exceeds the demand by more than the tolerance (utilization is noisy).
    feedback_margin: float = 0.05
    feedback_compute_tolerance: float = 0.25
    profile_iterations: int = 10
    # Keep each trial's learning curve and spans in the store (the simulator does not).
    history: bool = True
    # A workload's profile runs one waiting trial's parameters: when that run fails, the
    # trial fails (its parameters may be what crashes) and the profile is tried on
    # another trial's, up to this many trials per (workload, architecture), before the
    # workload counts as failed there.
    profile_samples: int = 3
    profile_warmup: int = 1
    policy: str | None = None  # overrides every study's policy when set
    policy_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    decision_log: int = 1000  # how many recent decisions to keep for inspection
    # The longest an Optuna search's sampler may ask for new trials in one decision (a
    # GP sampler's ask takes tenths of a second, and the server's lock is held): what is
    # left is asked at the next tick. None: no bound (the simulator, for repeatable runs).
    ask_budget_s: float | None = 0.1
    # Fair share, quotas and the highest priority each user may ask for, by user name
    # ("*": everyone not named); see `shares`.
    shares: Mapping[str, UserShare] = field(default_factory=dict)
    # Learn each architecture's ratio from the slowdown running trials report
    # (orchestrator/learned.py), between 1 and this (or the configured ratio, if
    # higher); at most one sample per GPU every so many seconds, and one decision per
    # architecture every so many seconds.
    learn_ratio: bool = False
    learn_ratio_max: float = 4.0
    learn_sample_every_s: float = 30.0
    learn_decide_every_s: float = 60.0
    learn_min_samples: int = 40  # samples before a ratio moves, and between two moves
    learn_settle_s: float = 10.0  # no sample from a GPU whose trials changed this lately
    # A fit per workload (trial's model) where it has learn_min_samples samples, weighed
    # by the trials running now; False: one fit of every sample.
    learn_by_workload: bool = True
    # The simulator, for the default policy `predict` (orchestrator/foresight.py): given
    # a study's space, the nodes, the profiles, this config and the candidate rules, the
    # makespan each rule gives the study in simulation. None: `predict` places as its
    # fallback. Injected: the simulator sits above the core.
    foresight: Foresight | None = None
    # Where `foresight` runs: None, here, the decision waiting for it (repeatable runs:
    # the simulator, tests); else an executor of its own (the server's: a process,
    # sim/process.py), which a study's first decision waits on at most foresight_wait_s
    # before its fallback places it until the choice is in.
    foresight_pool: Executor | None = None
    foresight_wait_s: float = 0.1
    # With learn_ratio: the simulator again, for the learner's foresight
    # (orchestrator/sharing.py): the study with the most trials pending simulated under
    # each candidate ratio of an architecture, with the learner's fits as the
    # interference; the ratio steps toward the one that ends it first. None, or
    # learn_foresight False: the learner's progress model sets the target.
    ratio_foresight: RatioForesight | None = None
    learn_foresight: bool = True

    def simulated(self) -> OrchestratorConfig:
        """This configuration as a simulation runs under it: with no simulator or pool
        of its own (no nested foresight), and so plain data that pickles (to the
        server's simulation process)."""
        return replace(self, foresight=None, ratio_foresight=None, foresight_pool=None)

    def share_rule(self, user: str) -> UserShare:
        rule = self.shares.get(user) or self.shares.get("*")
        return rule if rule is not None else _DEFAULT_SHARE

    def ratio(self, arch: str, study_ratios: Mapping[str, float]) -> float:
        if arch in study_ratios:
            return study_ratios[arch]
        return self.oversubscription.get(arch, self.default_ratio)
