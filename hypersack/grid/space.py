"""The search-space schema: models, hyperparameters as lists or ranges, search type, settings."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Collection
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hypersack.core import optim
from hypersack.core.bounds import (
    MAX_BATCH_SIZE,
    is_name,
)
from hypersack.core.catalog import MODELS
from hypersack.core.errors import InvalidInput
from hypersack.core.files import load_yaml, load_yaml_file, read_text_file
from hypersack.core.types import STATED_KEY
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
from hypersack.grid.settings import (
    HP_NAME,
    MULTI_OBJECTIVE_SAMPLERS,
    Pruner,
    Search,
    Settings,
)

# Where these lived before grid/settings.py: imports from here keep working.
from hypersack.grid.settings import Objective as Objective
from hypersack.grid.settings import StatedDemand as StatedDemand
from hypersack.grid.settings import StopBound as StopBound

KEY_PARAMS = ("batch_size", "optimizer", "precision")
RESERVED = ("model",)


MAX_HYPERPARAMETERS = 64
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
        raise InvalidInput(format_validation_error(exc, source, _SECTIONS)) from None


# The keys of the search space's sections, for "it belongs in program.preload".
_SECTIONS = {"": tuple(SearchSpace.model_fields), "settings": tuple(Settings.model_fields),
             "program": tuple(Program.model_fields)}

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
