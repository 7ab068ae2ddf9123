"""The policy registry: names to factories and their options, failing loudly on anything
unknown.

Built in: `predict` (the default: the rule whose simulated study ends soonest; options
candidates, max_trials, max_gpus; see `predict`), `auto` (eft unless pack places clearly more; see
`auto`), the paper's greedy rules (ff, ffd, wf, wfd; option hetero), `eft` (earliest
finish, predict's fallback; option hetero; see `greedy.EarliestFinishPolicy`), `pack`
(a composed policy, see `compose`; options order, score, improve, budget_ms, effort,
pairs_effort, portfolio, hetero, lp) and `optimal` (CP-SAT; options time_limit_s, workers, seed).

A user adds a policy without editing the project, in Python:

    from hypersack.policies import register_policy
    register_policy("mine", MyPolicy, MyOptions)   # MyOptions: a pydantic model or None

or from an installed package, through the entry-point group `hypersack.policies`:

    [project.entry-points."hypersack.policies"]
    mine = "my_package.policy:MyPolicy"

An entry point's object is the factory; its `options` attribute, where it has one, is
the options model. A factory is called with the validated options as keyword arguments
and returns an object with `name` and `place(items, cluster) -> Plan`. Every plan is
checked against the capacities before anything is launched, whichever policy made it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hypersack.core.errors import InvalidInput, UnknownName
from hypersack.core.validation import format_validation_error
from hypersack.policies.auto import AutoOptions
from hypersack.policies.base import Policy
from hypersack.policies.compose import ComposedOptions, ComposedPolicy
from hypersack.policies.greedy import EarliestFinishPolicy, GreedyOptions, GreedyPolicy
from hypersack.policies.predict import PredictOptions, PredictPolicy

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "hypersack.policies"


class NoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OptimalOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    time_limit_s: float = Field(default=10.0, gt=0, le=86_400)
    workers: int = Field(default=0, ge=0, le=1024)  # 0: every core of the machine
    seed: int = Field(default=0, ge=0, le=2**31 - 1)


@dataclass(frozen=True)
class _Entry:
    factory: Callable[..., Policy]
    options: type[BaseModel]


def _optimal(**options: Any) -> Policy:
    from hypersack.policies.optimal import OptimalPolicy

    return OptimalPolicy(**options)


def _greedy(name: str, decreasing: bool, worst: bool) -> Callable[..., Policy]:
    def make(**options: Any) -> Policy:
        return GreedyPolicy(name, decreasing=decreasing, worst=worst, **options)
    return make


def _auto(**options: Any) -> Policy:
    from hypersack.policies.auto import AutoPolicy

    return AutoPolicy(**options)


def _predict(**options: Any) -> Policy:
    # PredictOptions has refused `predict` itself and names given twice; what is
    # registered only the registry knows.
    for name in options.get("candidates", ()):
        if name not in _REGISTRY:
            raise ValueError(f"candidate {name!r} is not a registered policy; valid: "
                             f"{', '.join(n for n in _REGISTRY if n != 'predict')}")
    return PredictPolicy(**options)


_REGISTRY: dict[str, _Entry] = {
    "predict": _Entry(_predict, PredictOptions),
    "auto": _Entry(_auto, AutoOptions),
    "ff": _Entry(_greedy("ff", False, False), GreedyOptions),
    "ffd": _Entry(_greedy("ffd", True, False), GreedyOptions),
    "wf": _Entry(_greedy("wf", False, True), GreedyOptions),
    "wfd": _Entry(_greedy("wfd", True, True), GreedyOptions),
    "eft": _Entry(lambda **o: EarliestFinishPolicy(**o), GreedyOptions),
    "pack": _Entry(lambda **o: ComposedPolicy("pack", **o), ComposedOptions),
    "optimal": _Entry(_optimal, OptimalOptions),
}
_loaded_entry_points = False


def register_policy(name: str, factory: Callable[..., Policy],
                    options: type[BaseModel] | None = None, *, replace: bool = False) -> None:
    """Add a policy under `name`; `options` validates what `policy_options` give it
    (None: it takes none). A built-in or registered name is kept unless `replace`."""
    if not name or not name.replace("_", "").replace("-", "").isalnum() or len(name) > 64:
        raise InvalidInput(f"policy name {name!r}: letters, digits, '_' and '-' only")
    if name in _REGISTRY and not replace:
        raise InvalidInput(f"policy {name!r} is already registered")
    _REGISTRY[name] = _Entry(factory, options or NoOptions)


def _load_entry_points() -> None:
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            log.warning("policy entry point %s (%s) ignored: the name is taken", ep.name,
                        ep.value)
            continue
        try:
            factory = ep.load()
            options = getattr(factory, "options", None)
            if options is not None and not (isinstance(options, type)
                                            and issubclass(options, BaseModel)):
                raise TypeError("its 'options' is not a pydantic model")
            register_policy(ep.name, factory, options)
        except Exception as exc:  # a broken plug-in never stops the scheduler
            log.warning("policy entry point %s (%s) not loaded: %s", ep.name, ep.value, exc)


def policy_names() -> list[str]:
    _load_entry_points()
    return list(_REGISTRY)


def policy_options(name: str) -> list[str]:
    """The option names a policy takes."""
    _load_entry_points()
    if name not in _REGISTRY:
        raise UnknownName("policy", name, policy_names())
    return list(_REGISTRY[name].options.model_fields)


def make_policy(name: str, **options: Any) -> Policy:
    """A policy by name. Unknown names and bad options raise with the valid ones listed."""
    _load_entry_points()
    entry = _REGISTRY.get(name)
    if entry is None:
        raise UnknownName("policy", name, policy_names())
    valid = list(entry.options.model_fields)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise InvalidInput(
            f"policy {name!r} has no option {', '.join(map(repr, unknown))}; valid: "
            f"{', '.join(valid) if valid else '(none)'}"
        )
    try:
        checked = entry.options.model_validate(options)
    except ValidationError as exc:
        raise InvalidInput(format_validation_error(exc, f"policy {name!r}")) from None
    try:
        return entry.factory(**checked.model_dump(exclude_unset=True))
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"policy {name!r}: {exc}") from None


def parse_policy_options(pairs: list[str]) -> dict[str, Any]:
    """`key=value` strings from a command line; numbers become numbers."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise InvalidInput(f"policy option {pair!r} is not key=value")
        key, value = pair.split("=", 1)
        parsed: Any = value
        for conv in (int, float):
            try:
                parsed = conv(value)
                break
            except ValueError:
                continue
        out[key.strip()] = parsed
    return out
