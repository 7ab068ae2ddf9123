"""The search-space schema: models, hyperparameters as lists or ranges, search type, settings."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from hypersack.core.catalog import MODELS
from hypersack.core.errors import InvalidInput
from hypersack.core.validation import format_validation_error

MAX_TRIALS_CAP = 1_000_000
KEY_PARAMS = ("batch_size", "optimizer", "precision")
RESERVED = ("model",)


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _round(value: float) -> float:
    """Grid points rounded to 6 significant digits, so 1e-3 prints as 0.001."""
    return float(f"{value:.6g}")


class Choice(_Spec):
    distribution: Literal["choice"]
    values: list[Any] = Field(min_length=1)

    @field_validator("values")
    @classmethod
    def _unique(cls, values: list[Any]) -> list[Any]:
        seen = [json.dumps(v, sort_keys=True, default=str) for v in values]
        if len(set(seen)) != len(seen):
            raise ValueError(f"duplicated values in {values}")
        return values

    def grid(self) -> list[Any]:
        return list(self.values)


class Uniform(_Spec):
    distribution: Literal["uniform"]
    low: float
    high: float
    num: int | None = Field(default=None, ge=1)
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> Uniform:
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError("low and high must be finite numbers")
        if self.low > self.high:
            raise ValueError(f"empty range: low {self.low} > high {self.high}")
        if self.num is not None and self.step is not None:
            raise ValueError("give num or step, not both")
        return self

    def grid(self) -> list[Any] | None:
        if self.num is not None:
            if self.num == 1:
                return [_round(self.low)]
            return [_round(self.low + (self.high - self.low) * i / (self.num - 1))
                    for i in range(self.num)]
        if self.step is not None:
            count = math.floor((self.high - self.low) / self.step + 1e-9) + 1
            return [_round(self.low + i * self.step) for i in range(count)]
        return None


class LogUniform(_Spec):
    distribution: Literal["loguniform"]
    low: float
    high: float
    num: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _check(self) -> LogUniform:
        if self.low <= 0 or self.high <= 0:
            raise ValueError(f"loguniform needs low > 0 and high > 0 (got low={self.low}, "
                             f"high={self.high})")
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError("low and high must be finite numbers")
        if self.low > self.high:
            raise ValueError(f"empty range: low {self.low} > high {self.high}")
        return self

    def grid(self) -> list[Any] | None:
        if self.num is None:
            return None
        if self.num == 1:
            return [_round(self.low)]
        lo, hi = math.log(self.low), math.log(self.high)
        return [_round(math.exp(lo + (hi - lo) * i / (self.num - 1))) for i in range(self.num)]


class IntRange(_Spec):
    distribution: Literal["int"]
    low: int
    high: int
    step: int = Field(default=1, gt=0)

    @model_validator(mode="after")
    def _check(self) -> IntRange:
        if self.low > self.high:
            raise ValueError(f"empty range: low {self.low} > high {self.high}")
        return self

    def grid(self) -> list[Any]:
        return list(range(self.low, self.high + 1, self.step))


Hyperparameter = Annotated[
    Union[Choice, Uniform, LogUniform, IntRange], Field(discriminator="distribution")
]


class Search(_Spec):
    type: Literal["grid", "random"] = "grid"
    samples: int | None = Field(default=None, ge=1)
    seed: int = 0

    @model_validator(mode="after")
    def _check(self) -> Search:
        if self.type == "random" and self.samples is None:
            raise ValueError("random search needs samples")
        if self.type == "grid" and self.samples is not None:
            raise ValueError("samples is for random search; grid search takes every point")
        return self


class Objective(_Spec):
    """The metric a trial reports that ranks it; its last reported value is the objective."""

    metric: str = Field(default="loss", min_length=1, max_length=64)
    mode: Literal["min", "max"] = "min"


class Settings(_Spec):
    epochs: float = Field(default=1.0, gt=0)
    retries: int = Field(default=2, ge=0)
    policy: str = "wfd"
    oversubscription: dict[str, float] = Field(default_factory=dict)
    max_trials: int = Field(default=100_000, ge=1, le=MAX_TRIALS_CAP)
    objective: Objective = Field(default_factory=Objective)

    @field_validator("oversubscription")
    @classmethod
    def _ratios(cls, ratios: dict[str, float]) -> dict[str, float]:
        for arch, ratio in ratios.items():
            if not (ratio > 0 and math.isfinite(ratio)):
                raise ValueError(f"ratio for {arch!r} must be a positive number (got {ratio})")
        return ratios

    @field_validator("policy")
    @classmethod
    def _policy(cls, name: str) -> str:
        from hypersack.policies.registry import policy_names

        if name not in policy_names():
            raise ValueError(f"unknown policy {name!r}; valid: {', '.join(policy_names())}")
        return name


BUILTIN_PROGRAMS = ("train", "sleep")
PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# Placeholders every command template may use besides the hyperparameters.
COMMAND_FIELDS = ("python", "model", "epochs", "trial_id", "study_id", "workdir")


class Program(_Spec):
    """What a trial runs: a built-in workload (a module under hypersack.runner) or a
    command template such as `{python} train.py --lr {lr} --batch-size {batch_size}`.
    A template is split into arguments first and each argument filled in afterwards,
    so a parameter never reaches a shell."""

    builtin: Literal["train", "sleep"] | None = None
    command: str | None = Field(default=None, min_length=1, max_length=4096)
    options: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one(self) -> Program:
        if (self.builtin is None) == (self.command is None):
            raise ValueError("give exactly one of builtin (train or sleep) or command")
        if self.command is not None:
            try:
                argv = shlex.split(self.command)
            except ValueError as exc:
                raise ValueError(f"command: cannot split into arguments: {exc}") from None
            if not argv:
                raise ValueError("command: empty")
        return self

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
    description: str = ""
    models: list[ModelName] = Field(min_length=1)
    hyperparameters: dict[str, Hyperparameter]
    search: Search = Field(default_factory=Search)
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
        bs = self.hyperparameters.get("batch_size")
        if bs is None:
            raise ValueError("hyperparameters.batch_size: required (it decides a trial's demand)")
        values = bs.grid() if not isinstance(bs, (Uniform, LogUniform)) else None
        if values is None or not all(isinstance(v, int) and v > 0 for v in values):
            raise ValueError("hyperparameters.batch_size: must be positive integers "
                             "(a list or an int range)")
        if self.search.type == "grid":
            for name, hp in self.hyperparameters.items():
                if hp.grid() is None:
                    raise ValueError(f"hyperparameters.{name}: grid search needs num "
                                     "(or step) to discretize the range")
        unknown = self.program.placeholders() - set(self.hyperparameters) - set(COMMAND_FIELDS)
        if unknown:
            valid = sorted(set(self.hyperparameters) | set(COMMAND_FIELDS))
            raise ValueError(f"program.command: unknown placeholder(s) {sorted(unknown)}; "
                             f"valid: {', '.join(valid)}")
        size = self.size()
        if size > self.settings.max_trials:
            raise ValueError(f"the search space has {size} trials, more than "
                             f"settings.max_trials={self.settings.max_trials}")
        return self

    def axes(self) -> list[tuple[str, list[Any]]]:
        """The grid's axes in order: models first, then hyperparameters as declared."""
        axes: list[tuple[str, list[Any]]] = [("model", list(self.models))]
        for name, hp in self.hyperparameters.items():
            values = hp.grid()
            axes.append((name, list(values) if values is not None else []))
        return axes

    def size(self) -> int:
        if self.search.type == "random":
            assert self.search.samples is not None
            return self.search.samples
        return math.prod(len(values) for _, values in self.axes())


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML that rejects a key given twice instead of keeping the last silently."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicated key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping
)


def load_yaml(text: str, source: str) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InvalidInput(f"{source}: not valid YAML: {exc}") from None


def parse_space(data: Any, *, source: str = "search space") -> SearchSpace:
    if not isinstance(data, dict):
        raise InvalidInput(f"{source}: expected a mapping at the top level")
    try:
        return SearchSpace.model_validate(data)
    except ValidationError as exc:
        raise InvalidInput(format_validation_error(exc, source)) from None


def load_space(path: str | Path) -> SearchSpace:
    p = Path(path)
    if not p.exists():
        raise InvalidInput(f"search space file {str(p)!r} does not exist")
    return parse_space(load_yaml(p.read_text(), str(p)), source=str(p))
