"""`predict` (the default): the rule whose simulated study ends soonest.

No one rule ends every study soonest. Over scripts/sim_makespan.py's 144 scenarios
(clusters x compute-, memory- and core-bound studies x fusion x seeds) `eft` was within
2 % of the best policy in 112; `wfd` or `ffd` ended memory-bound studies up to 6.5 %
sooner, `auto` fused memory- and core-bound ones up to 11 %. Which one wins depends on
the study and the cluster, and the scheduler holds what decides it: the study's trials,
each workload's profile on each architecture, the nodes and the ratios. So a study under
`predict` is simulated once, before its first decision, under each candidate rule (the
real orchestrator on a virtual clock, `hypersack.sim`), and its decisions then use the
rule whose simulated study ended first (ties: the earlier candidate). The choice and
the simulated makespans are in the server's log and in `hypersack why` for the study's
waiting trials.

The orchestrator makes the choice (orchestrator/foresight.py); this object only says
which rules to try and what to do where none is chosen. Placed directly, as a policy
of one decision (`hypersack plan`, a benchmark, a process with no simulator wired in), it
is its fallback, `eft`. The fallback also places the studies whose course cannot be
simulated: adaptive searches and studies with a pruner (which trials run depends on
their results), studies of more than `max_trials` trials or on more than `max_gpus`
GPUs, and any study until every workload of it has a profile on the architectures it
may run on.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hypersack.policies.base import ClusterView, Item, Plan
from hypersack.policies.greedy import EarliestFinishPolicy

# `pack` and `optimal` are left out: they never ended a simulated study first, and a
# decision of theirs costs tens of milliseconds to seconds, the simulation hundreds.
CANDIDATES = ("eft", "auto", "wfd", "ffd", "wf", "ff")
FALLBACK = "eft"
# Larger studies and clusters: the fallback. The six candidates' simulations took 2.2 s
# for 2,000 trials on 128 GPUs, and 3.5 s for 96 trials on 8,000 (the nodes joining), on
# a 2-core machine; the server's event worker waits for them once per study.
MAX_TRIALS = 2000
MAX_GPUS = 512


class PredictOptions(BaseModel):
    """`predict`'s options (`policy_options: {predict: {...}}` in the server's settings)."""

    model_config = ConfigDict(extra="forbid")
    candidates: list[str] = Field(default_factory=lambda: list(CANDIDATES), min_length=1,
                                  max_length=16)
    max_trials: int = Field(default=MAX_TRIALS, ge=0, le=100_000)
    max_gpus: int = Field(default=MAX_GPUS, ge=0, le=100_000)

    @field_validator("candidates")
    @classmethod
    def _candidates(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError("a candidate is named twice")
        if "predict" in names:
            raise ValueError("predict cannot be its own candidate")
        return names


class PredictPolicy:
    name = "predict"

    def __init__(self, *, candidates: Sequence[str] = CANDIDATES,
                 max_trials: int = MAX_TRIALS, max_gpus: int = MAX_GPUS) -> None:
        opts = PredictOptions(candidates=list(candidates), max_trials=max_trials,
                              max_gpus=max_gpus)
        self.candidates = tuple(opts.candidates)
        self.max_trials = opts.max_trials
        self.max_gpus = opts.max_gpus
        self.fallback = FALLBACK
        self._fallback = EarliestFinishPolicy()

    def place(self, items: Sequence[Item], cluster: ClusterView) -> Plan:
        return self._fallback.place(items, cluster)
