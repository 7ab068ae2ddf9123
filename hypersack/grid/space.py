"""The search-space schema: models, hyperparameters as lists or ranges, search type, settings."""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hypersack.core import optim
from hypersack.core.bounds import (
    INT64_MAX,
    MAX_BATCH_SIZE,
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
    is_name,
)
from hypersack.core.catalog import MODELS
from hypersack.core.errors import InvalidInput
from hypersack.core.files import load_yaml, load_yaml_file, read_text_file
from hypersack.core.types import STATED_KEY, Demand
from hypersack.core.validation import format_validation_error
from hypersack.grid.params import (
    MAX_TRIALS_CAP,
    Choice,
    Hyperparameter,
    LogUniform,
    Uniform,
    _check_epochs,
    _in_distribution,
    _plain_value,
    _Spec,
    active,
    grid_size,
)

KEY_PARAMS = ("batch_size", "optimizer", "precision")
RESERVED = ("model",)


MAX_HYPERPARAMETERS = 64
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
    # Earliest finish: of the registered policies, the one whose studies end soonest in
    # the simulator (scripts/sim_makespan.py; docs/policies.md has the table).
    policy: str = "eft"
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


BUILTIN_PROGRAMS = ("train", "sleep")
MODULE_NAME = r"^[A-Za-z_][A-Za-z0-9_]{0,63}(\.[A-Za-z_][A-Za-z0-9_]{0,63}){0,7}$"
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Placeholders every command template may use besides the hyperparameters.
COMMAND_FIELDS = ("python", "model", "epochs", "trial_id", "study_id", "workdir")
# Placeholders the agent fills in itself: no hyperparameter may take their names (a
# hyperparameter `python` would choose the executable). `epochs` may be one: it is the
# trial's epochs.
RESERVED_NAMES = frozenset(COMMAND_FIELDS) - {"epochs"}


class Program(_Spec):
    """What a trial runs: a built-in workload (a module under hypersack.runner) or a
    command template such as `{python} train.py --lr {lr} --batch-size {batch_size}`.
    A template is split into arguments first and each argument filled in afterwards,
    so a parameter never reaches a shell."""

    builtin: Literal["train", "sleep"] | None = None
    command: str | None = Field(default=None, min_length=1, max_length=4096)
    options: dict[str, Any] = Field(default_factory=dict)
    # Modules a warm process imports once before it forks each trial of a command
    # program (`python script.py` or `python -m module`), e.g. [torch, numpy]: the trial
    # starts without paying for them (see the README's "Warm starts").
    preload: list[Annotated[str, Field(pattern=MODULE_NAME)]] = Field(default_factory=list,
                                                                       max_length=16)

    @model_validator(mode="after")
    def _one(self) -> Program:
        if (self.builtin is None) == (self.command is None):
            raise ValueError("give exactly one of builtin (train or sleep) or command")
        if self.preload and self.command is None:
            raise ValueError("preload: for command programs (a built-in program preloads "
                             "what it needs)")
        if self.command is not None:
            try:
                argv = shlex.split(self.command)
            except ValueError as exc:
                raise ValueError(f"command: cannot split into arguments: {exc}") from None
            if not argv:
                raise ValueError("command: empty")
        return self

    def identity(self) -> str:
        """A command program's default workload name: a hash of what it runs."""
        text = json.dumps({"command": self.command, "options": self.options}, sort_keys=True)
        return "cmd-" + hashlib.sha256(text.encode()).hexdigest()[:12]

    def placeholders(self) -> set[str]:
        if self.command is None:
            return set()
        return {m.group(1) for arg in shlex.split(self.command) for m in PLACEHOLDER.finditer(arg)}


def _known_model(name: str) -> str:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(sorted(MODELS))}")
    return name


ModelName = Annotated[str, AfterValidator(_known_model)]


class SearchSpace(_Spec):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = Field(default="", max_length=4096)
    # The zoo models; a command program may have none (then it is its own workload).
    models: list[ModelName] = Field(default_factory=list, max_length=len(MODELS))
    # A command program's workload name (its profiles' history); default: a hash of the
    # command and its options. The built-in programs' workloads are their models.
    workload: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:@+=-]{0,63}$")] | None \
        = None
    hyperparameters: dict[Annotated[str, Field(pattern=HP_NAME)], Hyperparameter] = Field(
        max_length=MAX_HYPERPARAMETERS)
    search: Search = Field(default_factory=Search)
    pruner: Pruner | None = None
    settings: Settings = Field(default_factory=Settings)
    program: Program = Field(default_factory=lambda: Program(builtin="train"))

    @field_validator("models")
    @classmethod
    def _models(cls, models: list[str]) -> list[str]:
        dup = sorted({m for m in models if models.count(m) > 1})
        if dup:
            raise ValueError(f"duplicated models {dup}")
        return models

    @field_validator("hyperparameters", mode="before")
    @classmethod
    def _lists_are_choices(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        out: dict[str, Any] = {}
        for name, spec in raw.items():
            if isinstance(spec, list):
                out[name] = {"distribution": "choice", "values": spec}
            elif isinstance(spec, (int, float, str, bool)):
                out[name] = {"distribution": "choice", "values": [spec]}
            else:
                out[name] = spec
        return out

    @model_validator(mode="after")
    def _check(self) -> SearchSpace:
        for name in RESERVED:
            if name in self.hyperparameters:
                raise ValueError(f"hyperparameters.{name}: reserved; list models under 'models'")
        reserved = sorted(RESERVED_NAMES & set(self.hyperparameters))
        if reserved:
            raise ValueError(f"hyperparameters.{reserved[0]}: a reserved name (the agent fills "
                             f"in {{{reserved[0]}}} itself); reserved: "
                             f"{', '.join(sorted(RESERVED_NAMES))}")
        if self.pruner is not None:
            self._check_pruner(self.pruner)
        if self.settings.multi_objective:
            self._check_objectives()
        self._check_conditions()
        if self.search.type == "grid":
            for name, hp in self.hyperparameters.items():
                if hp.count() is None:
                    raise ValueError(f"hyperparameters.{name}: grid search needs num "
                                     "(or step) to discretize the range")
        # Sized before anything is expanded: a range of a billion points stops here.
        size = self.size()
        if size > self.settings.max_trials:
            raise ValueError(f"the search space has {size} trials, more than "
                             f"settings.max_trials={self.settings.max_trials}")
        builtin = self.program.builtin is not None
        if builtin and not self.models:
            raise ValueError(f"models: the built-in program {self.program.builtin!r} trains "
                             "zoo models; name at least one (a command program needs none)")
        if builtin and self.workload is not None:
            raise ValueError("workload: only for command programs (a built-in program's "
                             "workload is its model)")
        if self.workload is not None and self.workload.split(":")[-1] in MODELS:
            raise ValueError(f"workload: {self.workload!r} is a zoo model's name; a command "
                             "program's workload is its own (name it after your program)")
        if self.settings.demand is not None and STATED_KEY in (self.settings.demand_keys or []):
            raise ValueError(f"settings.demand_keys: {STATED_KEY!r} is reserved (the study "
                             "that states a demand)")
        if not self.models and "model" in self.program.placeholders():
            raise ValueError("program.command: {model} needs models")
        bs = self.hyperparameters.get("batch_size")
        if bs is None and builtin:
            raise ValueError("hyperparameters.batch_size: required (it decides a trial's demand)")
        if bs is not None:
            values = bs.grid() if not isinstance(bs, (Uniform, LogUniform)) else None
            if values is None or not all(type(v) is int and 0 < v <= MAX_BATCH_SIZE
                                         for v in values):
                raise ValueError("hyperparameters.batch_size: must be positive integers up "
                                 f"to {MAX_BATCH_SIZE} (a list or an int range)")
        keys = self.settings.demand_keys or []
        if len(set(keys)) != len(keys):
            raise ValueError("settings.demand_keys: a name is given twice")
        for name in keys:
            if name != "model" and name not in self.hyperparameters:
                raise ValueError(f"settings.demand_keys: {name!r} is not a hyperparameter")
            if name == "model" and not self.models:
                raise ValueError("settings.demand_keys: 'model' needs models")
        epochs = self.hyperparameters.get("epochs")
        if epochs is not None:
            _check_epochs(epochs)
        for name in ("optimizer", "precision"):
            key_hp = self.hyperparameters.get(name)
            if key_hp is not None and not (isinstance(key_hp, Choice) and all(
                    isinstance(v, str) and is_name(v) for v in key_hp.values)):
                raise ValueError(f"hyperparameters.{name}: must be a list of names (letters, "
                                 "digits and _.:@+=-)")
        chosen = self.hyperparameters.get("optimizer")
        if self.program.builtin == "train" and isinstance(chosen, Choice):
            bad = [v for v in chosen.values if v not in optim.OPTIMIZERS]
            if bad:
                raise ValueError(f"hyperparameters.optimizer: the built-in trainer has no "
                                 f"{bad[0]!r}; valid: {', '.join(optim.OPTIMIZERS)}")
        unknown = self.program.placeholders() - set(self.hyperparameters) - set(COMMAND_FIELDS)
        if unknown:
            valid = sorted(set(self.hyperparameters) | set(COMMAND_FIELDS))
            raise ValueError(f"program.command: unknown placeholder(s) {sorted(unknown)}; "
                             f"valid: {', '.join(valid)}")
        return self

    def _check_conditions(self) -> None:
        """A `when` tests the model or hyperparameters declared before its own, with
        values they can take; the demand keys and epochs are always defined; a command
        reads a conditional hyperparameter from HYPERSACK_PARAMS, not a placeholder."""
        earlier: dict[str, Any] = {"model": None} if self.models else {}
        for name, hp in self.hyperparameters.items():
            for tested, values in (hp.when or {}).items():
                if tested not in earlier:
                    raise ValueError(
                        f"hyperparameters.{name}.when: {tested[:64]!r} is not "
                        + ("declared before it" if tested in self.hyperparameters else
                           "a hyperparameter (or model)") + "; a condition tests the model "
                        "or hyperparameters declared before the one it conditions")
                for v in values:
                    try:
                        if tested == "model":
                            if v not in self.models:
                                raise ValueError(f"{str(v)[:64]!r} is not one of the models")
                        else:
                            _in_distribution(earlier[tested], v)
                    except ValueError as exc:
                        raise ValueError(f"hyperparameters.{name}.when.{tested}: {exc}"
                                         ) from None
            if hp.when is not None and name in (*KEY_PARAMS, "epochs"):
                raise ValueError(f"hyperparameters.{name}: a demand key (or epochs) is "
                                 "defined for every trial; it takes no 'when'")
            if hp.when is not None and name in self.program.placeholders():
                raise ValueError(f"program.command: {{{name}}} is conditional (absent where "
                                 "its 'when' does not hold); read it from HYPERSACK_PARAMS "
                                 "(JSON) instead")
            earlier[name] = hp

    def conditions(self) -> dict[str, dict[str, list[Any]]]:
        """Each conditional hyperparameter's `when`, in declaration order."""
        return {n: dict(hp.when) for n, hp in self.hyperparameters.items() if hp.when}

    def _check_objectives(self) -> None:
        if self.pruner is not None:
            raise ValueError("pruner: a pruner ranks trials on one objective, and this "
                             "study has several (settings.objectives); as in Optuna, a "
                             "multi-objective study cannot prune: drop the pruner or keep one "
                             "objective")
        if self.search.type == "optuna" and self.search.sampler not in \
                MULTI_OBJECTIVE_SAMPLERS:
            raise ValueError(f"search.sampler {self.search.sampler} takes one objective; "
                             "for several (settings.objectives) use one of "
                             f"{', '.join(MULTI_OBJECTIVE_SAMPLERS)}")

    def _check_pruner(self, pruner: Pruner) -> None:
        if "epochs" in self.hyperparameters:
            raise ValueError("pruner: trials of one study need one length to be ranked at "
                             "the same rungs (drop the epochs hyperparameter)")
        if pruner.min_epochs >= self.settings.epochs:
            raise ValueError(f"pruner.min_epochs: {pruner.min_epochs} leaves no rung before "
                             f"the last epoch (settings.epochs = {self.settings.epochs:g})")

    def pause_mode(self) -> bool:
        """Whether the pruner stops trials at rungs and resumes the promoted ones."""
        if self.pruner is None or self.pruner.type == "median":
            return False
        if self.pruner.mode == "auto":
            return self.program.builtin is not None
        return self.pruner.mode == "pause"

    def point(self, params: Any) -> dict[str, Any]:
        """A trial's parameters given from outside (`Client.ask`), checked against the
        space: every hyperparameter named once, each value in its distribution, and the
        model one of the study's (it may be left out where there is one). Raises
        InvalidInput saying what is wrong."""
        if not isinstance(params, dict):
            raise InvalidInput("a trial's parameters are a mapping of name to value")
        out: dict[str, Any] = {}
        given = dict(params)
        if self.models:
            model = given.pop("model", self.models[0] if len(self.models) == 1 else None)
            if model not in self.models:
                raise InvalidInput(f"model: {str(model)[:64]!r} is not one of the study's "
                                   f"({', '.join(self.models)})")
            out["model"] = model
        defined: list[str] = []  # in order: a condition reads the values before it
        for name, hp in self.hyperparameters.items():
            if active(hp, {**out, **{n: given[n] for n in defined if n in given}}):
                defined.append(name)
        unknown = sorted(set(given) - set(defined))
        missing = sorted(set(defined) - set(given))
        if unknown or missing:
            raise InvalidInput(
                "parameters: " + "; ".join(
                    ([f"unknown {', '.join(n[:64] for n in unknown[:5])}"] if unknown else [])
                    + ([f"missing {', '.join(missing[:5])}"] if missing else []))
                + f" (defined for these values: {', '.join(defined)})")
        for name in defined:
            hp = self.hyperparameters[name]
            try:
                out[name] = _in_distribution(hp, _plain_value(given[name]))
            except ValueError as exc:
                raise InvalidInput(f"parameters.{name}: {exc}") from None
        return out

    def axes(self) -> list[tuple[str, list[Any]]]:
        """The grid's axes in order: models first (if any), then hyperparameters as
        declared."""
        axes: list[tuple[str, list[Any]]] = [("model", list(self.models))] if self.models \
            else []
        for name, hp in self.hyperparameters.items():
            values = hp.grid()
            axes.append((name, list(values) if values is not None else []))
        return axes

    def size(self) -> int:
        """The number of trials, computed without expanding anything."""
        if self.search.type == "random":
            assert self.search.samples is not None
            return self.search.samples
        if self.search.adaptive:
            assert self.search.trials is not None
            return self.search.trials
        if self.conditions():
            return grid_size(self.axes(), self.hyperparameters)
        size = max(1, len(self.models))
        for hp in self.hyperparameters.values():
            size *= hp.count() or 0
            if size > MAX_TRIALS_CAP:  # stop multiplying: already too many
                return size
        return size


def parse_space(data: Any, *, source: str = "search space",
                policies: Collection[str] | None = None) -> SearchSpace:
    """A validated search space; `policies`: the valid policy names (None: any name, for
    spaces stored after they were checked)."""
    if not isinstance(data, dict):
        raise InvalidInput(f"{source}: expected a mapping at the top level")
    try:
        return SearchSpace.model_validate(data, context={"policies": policies})
    except ValidationError as exc:
        raise InvalidInput(format_validation_error(exc, source)) from None


SPACE_DIR = "{space_dir}"


def fill_space_dir(data: Any, path: str | Path) -> Any:
    """`{space_dir}` in a command template: the folder of the search-space file, filled
    in where the file is read (so `{python} {space_dir}/train.py` finds the script beside
    it, whatever the trial's working directory)."""
    program = data.get("program") if isinstance(data, dict) else None
    if not isinstance(program, dict):
        return data
    command = program.get("command")
    if not isinstance(command, str) or SPACE_DIR not in command:
        return data
    folder = shlex.quote(str(Path(path).resolve().parent))
    return {**data, "program": {**program, "command": command.replace(SPACE_DIR, folder)}}


def read_space_file(path: str | Path) -> str:
    """A search-space file as the text to submit: `{space_dir}` filled in (as JSON then;
    otherwise the file's own text, comments and all)."""
    text = read_text_file(path, "search space file")
    if SPACE_DIR not in text:
        return text
    return json.dumps(fill_space_dir(load_yaml(text, str(path)), path))


def load_space(path: str | Path, policies: Collection[str] | None = None) -> SearchSpace:
    data = fill_space_dir(load_yaml_file(path, "search space file"), path)
    return parse_space(data, source=str(path), policies=policies)
