"""A study's settings and search: how its points are chosen (`Search`), pruned
(`Pruner`) and ranked (`Objective`), and the `Settings` block of a search space (epochs,
retries, policy, sharing, fusion, a stated demand). `space` assembles them with the
models, hyperparameters and program into a `SearchSpace`."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    StringConstraints,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hypersack.core.bounds import (
    INT64_MAX,
    MAX_COMPUTE_PCT,
    MAX_CORES,
    MAX_EPOCHS,
    MAX_FUSED_MEMBERS,
    MAX_MEMORY_MIB,
    MAX_PRIORITY,
    MAX_RATIO,
    MAX_SECONDS,
    MAX_WEIGHT,
    Epochs,
)
from hypersack.core.types import Demand
from hypersack.grid.params import MAX_TRIALS_CAP, _Spec

MAX_RETRIES = 100
HP_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"  # usable as a {placeholder}


SAMPLERS = ("tpe", "gp", "cmaes", "random", "qmc", "nsga2")
# Samplers that take several objectives (a multi-objective study).
MULTI_OBJECTIVE_SAMPLERS = ("tpe", "gp", "random", "qmc", "nsga2")


class Search(_Spec):
    """How the space is searched: `grid` (every point), `random` (`samples` points),
    `optuna` (`trials` points asked of an Optuna sampler as capacity frees, each told
    its outcome), or `manual` (`trials` points that the study's owner gives with
    `Client.ask`, from an optimizer of their own)."""

    type: Literal["grid", "random", "optuna", "manual"] = "grid"
    samples: int | None = Field(default=None, ge=1, le=MAX_TRIALS_CAP)
    trials: int | None = Field(default=None, ge=1, le=MAX_TRIALS_CAP)
    sampler: Literal["tpe", "gp", "cmaes", "random", "qmc", "nsga2"] = "tpe"
    seed: int = Field(default=0, ge=0, le=INT64_MAX)

    @model_validator(mode="after")
    def _check(self) -> Search:
        if self.type == "random" and self.samples is None:
            raise ValueError("random search needs samples")
        if self.type == "grid" and self.samples is not None:
            raise ValueError("samples is for random search; grid search takes every point")
        if self.adaptive and self.trials is None:
            raise ValueError(f"{self.type} search needs trials (how many it will have)")
        if not self.adaptive and self.trials is not None:
            raise ValueError("trials is for optuna and manual search (random search takes "
                             "samples)")
        if self.adaptive and self.samples is not None:
            raise ValueError(f"samples is for random search; {self.type} search takes trials")
        if self.type != "optuna" and self.sampler != "tpe":
            raise ValueError("sampler is for optuna search")
        if self.type == "optuna" and self.seed >= 2**32:
            raise ValueError("seed: optuna's samplers take seeds below 2**32")
        return self

    @property
    def adaptive(self) -> bool:
        """Trials are made as the search goes (asked of a sampler, or given by the
        owner), not all up front."""
        return self.type in ("optuna", "manual")


MAX_REDUCTION = 100


class Pruner(_Spec):
    """Early stopping: trials are ranked on the objective at rungs and the worst stop
    (PRUNED), freeing their capacity.

    - `asha`: rungs at `min_epochs` x `reduction_factor`^k epochs; at each rung the best
      1/`reduction_factor` of the trials ranked there go on (asynchronous successive
      halving).
    - `hyperband`: several ASHA brackets, each starting at a later rung; trials are
      dealt to the brackets in turn.
    - `median`: from `min_epochs` on, a trial whose objective at an epoch is worse than
      the median of the others' at that epoch stops, once `min_trials` others have one.

    `mode`: `pause` stops a trial at each rung with a checkpoint (the built-in programs
    write one; a command program uses `hypersack.checkpoint_dir()` and
    `hypersack.should_stop()`) and resumes the promoted ones, so a rung's trials are
    ranked together and promoted trials can share GPUs; `stop` lets trials run on and
    stops the ones that rank too low when they reach a rung; `auto`: `pause` for the
    built-in programs, `stop` for a command."""

    type: Literal["asha", "hyperband", "median"]
    min_epochs: int = Field(default=1, ge=1, le=int(MAX_EPOCHS))
    reduction_factor: int = Field(default=3, ge=2, le=MAX_REDUCTION)
    min_trials: int = Field(default=5, ge=1, le=MAX_TRIALS_CAP)
    mode: Literal["auto", "pause", "stop"] = "auto"
    # Pause mode: a rung's promotions wait this long for more of the rung's trials to be
    # promoted, and resume together (one decision packs them).
    promotion_window_s: float = Field(default=0.0, ge=0, le=MAX_SECONDS)

    @model_validator(mode="after")
    def _check(self) -> Pruner:
        if self.type == "median" and self.mode == "pause":
            raise ValueError("the median pruner decides at every epoch: mode stop (or auto)")
        return self


class Objective(_Spec):
    """The metric a trial reports that ranks it; its last reported value is the objective."""

    metric: str = Field(default="loss", min_length=1, max_length=64,
                        pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")
    mode: Literal["min", "max"] = "min"


class StatedDemand(_Spec):
    """A trial's demand as the study states it: compute (percent of one GPU), memory and
    cores; `epoch_s`, the seconds one epoch takes, orders trials longest first."""

    compute_pct: float = Field(ge=0, le=MAX_COMPUTE_PCT)
    memory_mib: int = Field(gt=0, le=MAX_MEMORY_MIB)
    cores: float = Field(default=1.0, ge=0, le=MAX_CORES)
    epoch_s: float = Field(default=60.0, gt=0, le=MAX_SECONDS)

    def demand(self) -> Demand:
        return Demand(compute_pct=self.compute_pct, memory_mib=self.memory_mib,
                      cores=self.cores)


ARCH_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.:@+-]{0,63}$"


class StopBound(_Spec):
    """A trial whose metric goes past a bound is stopped as DIVERGED (its capacity freed)."""

    above: float | None = None
    below: float | None = None

    @model_validator(mode="after")
    def _one(self) -> StopBound:
        if self.above is None and self.below is None:
            raise ValueError("give above, below or both")
        return self


MetricName = Annotated[str, StringConstraints(min_length=1, max_length=64,
                                              pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$")]


class Settings(_Spec):
    epochs: Epochs = 1.0
    retries: int = Field(default=2, ge=0, le=MAX_RETRIES)
    # The rule whose simulated study ends soonest (policies/predict.py; eft where the
    # study's course cannot be simulated). scripts/sim_makespan.py has the table.
    policy: str = "predict"
    oversubscription: dict[str, float] = Field(default_factory=dict)
    max_trials: int = Field(default=100_000, ge=1, le=MAX_TRIALS_CAP)
    objective: Objective = Field(default_factory=Objective)
    # Several objectives (a multi-objective study, e.g. accuracy up and latency down):
    # trials are told to the sampler with every value, and the results mark the Pareto
    # front. The first is `objective` too: tables sort by it and curves draw it.
    objectives: list[Objective] | None = Field(default=None, min_length=2, max_length=8)
    # A trial that reports metrics without the objective stops the study at once (a
    # misspelt metric would otherwise run every trial to its end, and teach the search
    # nothing); true: such trials run on, and complete without an objective.
    allow_missing_objective: bool = False
    # Stop a trial as DIVERGED once a metric goes past a bound: {loss: {above: 1.0e6}}.
    stop_if: dict[MetricName, StopBound] = Field(default_factory=dict, max_length=16)
    # The hyperparameters that change a trial's demand (default: batch_size, optimizer
    # and precision where the space has them, and the model of a command program).
    demand_keys: list[Annotated[str, Field(pattern=HP_NAME)]] | None = Field(
        default=None, max_length=16)
    # A demand stated instead of measured (no profiling): one for every architecture,
    # or one per architecture ({A100: {...}, H100: {...}}).
    demand: StatedDemand | Annotated[dict[Annotated[str, Field(pattern=ARCH_NAME)],
                                          StatedDemand], Field(max_length=64)] | None = None
    # Fused groups: trials that differ only in fusable hyperparameters (learning rate,
    # weight decay, momentum, betas, seed) may train together in one process where that
    # places more work; `auto`: so, except in a study with a pruner (there a group
    # delays each member's rung, and the simulator's ASHA studies ended 0-13 % later);
    # `on`: also with a pruner; `off`: never. `max_fusion_width`: the most in a group.
    fusion: Literal["auto", "on", "off"] = "auto"
    max_fusion_width: int = Field(default=8, ge=1, le=MAX_FUSED_MEMBERS)
    # Sharing the cluster with other studies (see docs/sharing.md): a
    # higher priority decides first; `weight` is this study's part of its user's fair
    # share; `preempt: true` stops trials of lower-priority studies to make room.
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    weight: float = Field(default=1.0, gt=0, le=MAX_WEIGHT)
    preempt: bool = False

    @model_validator(mode="before")
    @classmethod
    def _first_objective(cls, raw: Any) -> Any:
        """With `objectives`, `objective` is the first of them (given or not)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("objectives"), list) \
                or not raw["objectives"]:
            return raw
        first = raw["objectives"][0]
        if "objective" in raw and raw["objective"] != first:
            raise ValueError("give objective (one metric) or objectives (several), not "
                             "both; the first of objectives is the one tables rank by")
        return {**raw, "objective": first}

    @field_validator("objectives")
    @classmethod
    def _distinct(cls, objectives: list[Objective] | None) -> list[Objective] | None:
        names = [o.metric for o in objectives or []]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"metric {dup[0]!r} is given twice")
        return objectives

    @property
    def goals(self) -> list[Objective]:
        """Every objective: the one, or the several of a multi-objective study."""
        return list(self.objectives) if self.objectives else [self.objective]

    @property
    def multi_objective(self) -> bool:
        return self.objectives is not None

    def stated_on(self, arch: str) -> StatedDemand | None:
        """The demand the study states for an architecture (None: it states none)."""
        return self.demand.get(arch) if isinstance(self.demand, dict) else self.demand

    @field_validator("fusion", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        """YAML 1.1, which PyYAML reads, takes an unquoted `on` or `off` (and `yes`,
        `no`) for a boolean: `fusion: on` means "on", `fusion: false` "off"."""
        if value is True:
            return "on"
        if value is False:
            return "off"
        return value

    @field_validator("oversubscription")
    @classmethod
    def _ratios(cls, ratios: dict[str, float]) -> dict[str, float]:
        for arch, ratio in ratios.items():
            if not (0 < ratio <= MAX_RATIO and math.isfinite(ratio)):
                raise ValueError(f"ratio for {arch!r} must be a number in (0, {MAX_RATIO:g}] "
                                 f"(got {ratio})")
        return ratios

    @field_validator("policy")
    @classmethod
    def _policy(cls, name: str, info: ValidationInfo) -> str:
        # The grid does not know the policies (they are a layer beside it): whoever
        # parses a space for submission passes the registry's names in the context.
        valid = (info.context or {}).get("policies")
        if valid is not None and name not in valid:
            raise ValueError(f"unknown policy {name!r}; valid: {', '.join(valid)}")
        return name
