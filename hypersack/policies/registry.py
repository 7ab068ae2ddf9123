"""The policy registry: names to constructors, failing loudly on anything unknown."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from hypersack.core.errors import InvalidInput, UnknownName
from hypersack.policies.base import Policy
from hypersack.policies.greedy import GreedyPolicy


def _optimal(**options: Any) -> Policy:
    from hypersack.policies.optimal import OptimalPolicy

    return OptimalPolicy(**options)


def _optimal_options() -> list[str]:
    from hypersack.policies.optimal import OptimalPolicy

    return [p for p in inspect.signature(OptimalPolicy.__init__).parameters if p != "self"]


_GREEDY = {
    "ff": (False, False),
    "ffd": (True, False),
    "wf": (False, True),
    "wfd": (True, True),
}

DEFAULT_POLICY = "wfd"


def _greedy_factory(name: str) -> Callable[..., Policy]:
    decreasing, worst = _GREEDY[name]

    def make(**options: Any) -> Policy:
        return GreedyPolicy(name, decreasing=decreasing, worst=worst)

    return make


_FACTORIES: dict[str, tuple[Callable[..., Policy], Callable[[], list[str]]]] = {
    **{name: (_greedy_factory(name), list) for name in _GREEDY},
    "optimal": (_optimal, _optimal_options),
}


def policy_names() -> list[str]:
    return list(_FACTORIES)


def make_policy(name: str, **options: Any) -> Policy:
    """A policy by name. Unknown names and options raise with the valid ones listed."""
    if name not in _FACTORIES:
        raise UnknownName("policy", name, policy_names())
    factory, valid_options = _FACTORIES[name]
    valid = valid_options()
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise InvalidInput(
            f"policy {name!r} has no option {', '.join(map(repr, unknown))}; valid: "
            f"{', '.join(valid) if valid else '(none)'}"
        )
    try:
        return factory(**options)
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
