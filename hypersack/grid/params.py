"""A search space's hyperparameters: each one's distribution (a choice, a uniform,
log-uniform or integer range), its grid, its samples, and when it is defined at all
(`when`: a conditional hyperparameter exists only where earlier ones take given
values, as an optimizer's own parameters where that optimizer is chosen)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from hypersack.core.bounds import (
    INT64_MAX,
    MAX_EPOCHS,
    MIN_EPOCHS,
)

MAX_TRIALS_CAP = 1_000_000
MAX_VALUE_CHARS = 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class _Spec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False, strict=True)


def _plain_value(value: Any) -> Any:
    """A hyperparameter value: a bool, a 64-bit integer, a finite float or a short
    printable string (a value reaches command lines, file names and tables)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if abs(value) > INT64_MAX:
            raise ValueError(f"integer {value} does not fit in 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value} is not a finite number")
        return value
    if isinstance(value, str):
        if len(value) > MAX_VALUE_CHARS:
            raise ValueError(f"a string value is longer than {MAX_VALUE_CHARS} characters")
        if _CONTROL.search(value):
            raise ValueError(f"{value[:40]!r} contains control characters")
        return value
    raise ValueError(f"{str(value)[:40]!r} is a {type(value).__name__}; values are numbers, "
                     "strings or booleans")


def _range_count(low: float, high: float, step: float) -> int:
    """How many points `low, low + step, ... <= high` has, without making them; more than
    MAX_TRIALS_CAP is an error."""
    span = (high - low) / step
    if not math.isfinite(span) or span + 1 > MAX_TRIALS_CAP:
        raise ValueError(f"the range has more than {MAX_TRIALS_CAP} points")
    return math.floor(span + 1e-9) + 1


def _round(value: float) -> float:
    """Grid points rounded to 6 significant digits, so 1e-3 prints as 0.001."""
    return float(f"{value:.6g}")


MAX_CONDITIONS = 8  # names one `when` may test


class _Param(_Spec):
    """What every distribution has: `when`, the values earlier hyperparameters (or the
    model) must take for this one to be defined. Absent: always defined."""

    when: dict[str, list[Any]] | None = Field(default=None, max_length=MAX_CONDITIONS)

    @field_validator("when", mode="before")
    @classmethod
    def _listed(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        out = {}
        for name, values in raw.items():
            values = values if isinstance(values, list) else [values]
            if not values:
                raise ValueError(f"when.{name}: no values (it would never be defined)")
            out[name] = [_plain_value(v) for v in values]
        return out


def active(hp: _Param, params: Mapping[str, Any]) -> bool:
    """Whether the hyperparameter is defined for a trial with these (earlier) values."""
    if hp.when is None:
        return True
    return all(name in params and _key(params[name]) in {_key(v) for v in values}
               for name, values in hp.when.items())


def _key(value: Any) -> str:
    """Equal values of a hyperparameter (1 and 1.0 are one value, as in a command)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True)


def grid_points(axes: list[tuple[str, list[Any]]], hps: Mapping[str, _Param]
                ) -> Iterator[tuple[tuple[int, ...], dict[str, Any]]]:
    """The grid's points in order (coordinates and values): the Cartesian product of the
    axes, where an axis whose hyperparameter is not defined for the values before it
    takes no value (coordinate -1)."""
    def points(i: int, coords: tuple[int, ...], params: dict[str, Any]
               ) -> Iterator[tuple[tuple[int, ...], dict[str, Any]]]:
        if i == len(axes):
            yield coords, params
            return
        name, values = axes[i]
        hp = hps.get(name)
        if hp is not None and not active(hp, params):
            yield from points(i + 1, (*coords, -1), params)
            return
        for j, v in enumerate(values):
            yield from points(i + 1, (*coords, j), {**params, name: v})

    yield from points(0, (), {})


def grid_size(axes: list[tuple[str, list[Any]]], hps: Mapping[str, _Param],
              cap: int = MAX_TRIALS_CAP) -> int:
    """How many points `grid_points` gives, without making them: only the axes a `when`
    tests are walked value by value; past `cap` the count stops (any larger number)."""
    tested = {n for hp in hps.values() if hp.when for n in hp.when}
    steps = [0]

    def count(i: int, params: dict[str, Any]) -> int:
        steps[0] += 1
        if steps[0] > cap:
            raise ValueError(f"the conditions make more than {cap} combinations to count")
        if i == len(axes):
            return 1
        name, values = axes[i]
        hp = hps.get(name)
        if hp is not None and not active(hp, params):
            return count(i + 1, params)
        if name in tested:
            total = 0
            for v in values:
                total += count(i + 1, {**params, name: v})
                if total > cap:
                    return total
            return total
        rest = count(i + 1, params)
        return len(values) * rest

    return count(0, {})


class Choice(_Param):
    distribution: Literal["choice"]
    values: list[Any] = Field(min_length=1, max_length=MAX_TRIALS_CAP)

    @field_validator("values")
    @classmethod
    def _unique(cls, values: list[Any]) -> list[Any]:
        for v in values:
            _plain_value(v)
        seen = [json.dumps(v, sort_keys=True, default=str) for v in values]
        if len(set(seen)) != len(seen):
            raise ValueError(f"duplicated values in {values}")
        return values

    def grid(self) -> list[Any]:
        return list(self.values)

    def count(self) -> int | None:
        return len(self.values)


class Uniform(_Param):
    distribution: Literal["uniform"]
    low: float
    high: float
    num: int | None = Field(default=None, ge=1, le=MAX_TRIALS_CAP)
    step: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _check(self) -> Uniform:
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError("low and high must be finite numbers")
        if self.low > self.high:
            raise ValueError(f"empty range: low {self.low} > high {self.high}")
        if self.num is not None and self.step is not None:
            raise ValueError("give num or step, not both")
        if self.step is not None:
            _range_count(self.low, self.high, self.step)
        return self

    def count(self) -> int | None:
        if self.num is not None:
            return self.num
        if self.step is not None:
            return _range_count(self.low, self.high, self.step)
        return None

    def grid(self) -> list[Any] | None:
        if self.num is not None:
            if self.num == 1:
                return [_round(self.low)]
            return [_round(self.low + (self.high - self.low) * i / (self.num - 1))
                    for i in range(self.num)]
        if self.step is not None:
            count = _range_count(self.low, self.high, self.step)
            return [_round(self.low + i * self.step) for i in range(count)]
        return None


class LogUniform(_Param):
    distribution: Literal["loguniform"]
    low: float
    high: float
    num: int | None = Field(default=None, ge=1, le=MAX_TRIALS_CAP)

    def count(self) -> int | None:
        return self.num

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


class IntRange(_Param):
    distribution: Literal["int"]
    low: int = Field(ge=-INT64_MAX, le=INT64_MAX)
    high: int = Field(ge=-INT64_MAX, le=INT64_MAX)
    step: int = Field(default=1, gt=0, le=INT64_MAX)

    @model_validator(mode="after")
    def _check(self) -> IntRange:
        if self.low > self.high:
            raise ValueError(f"empty range: low {self.low} > high {self.high}")
        if (self.high - self.low) // self.step + 1 > MAX_TRIALS_CAP:
            raise ValueError(f"the range has more than {MAX_TRIALS_CAP} points")
        return self

    def count(self) -> int | None:
        return (self.high - self.low) // self.step + 1

    def grid(self) -> list[Any]:
        return list(range(self.low, self.high + 1, self.step))


Hyperparameter = Annotated[
    Union[Choice, Uniform, LogUniform, IntRange], Field(discriminator="distribution")
]


def _in_distribution(hp: Choice | Uniform | LogUniform | IntRange, value: Any) -> Any:
    """The value, if the distribution can give it; raises ValueError otherwise."""
    if isinstance(hp, Choice):
        key = json.dumps(value, sort_keys=True)
        for v in hp.values:
            if json.dumps(v, sort_keys=True) == key:
                return v
        raise ValueError(f"{str(value)[:64]!r} is not one of {hp.values[:10]}")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{str(value)[:64]!r} is not a number")
    if isinstance(hp, IntRange):
        if not isinstance(value, int) and not (isinstance(value, float) and value.is_integer()):
            raise ValueError(f"{value!r} is not an integer")
        value = int(value)
        if not (hp.low <= value <= hp.high and (value - hp.low) % hp.step == 0):
            raise ValueError(f"{value} is not in {hp.low}..{hp.high} step {hp.step}")
        return value
    if not hp.low <= value <= hp.high:
        raise ValueError(f"{value!r} is outside [{hp.low:g}, {hp.high:g}]")
    return value


def _check_epochs(hp: Choice | Uniform | LogUniform | IntRange) -> None:
    """An `epochs` hyperparameter sets each trial's epochs: positive finite numbers."""
    bad = ValueError(f"hyperparameters.epochs: must be numbers from {MIN_EPOCHS:g} to "
                     f"{MAX_EPOCHS:g}")
    if isinstance(hp, Choice):
        if not all(type(v) in (int, float) and MIN_EPOCHS <= v <= MAX_EPOCHS
                   for v in hp.values):
            raise bad
    elif not (hp.low >= MIN_EPOCHS and hp.high <= MAX_EPOCHS):
        raise bad


