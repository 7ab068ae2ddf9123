"""The built-in trainer's optimizers and their hyperparameters, read the same way by the
plain trainer, the fused trainer and the agent that writes a fused group's spec.

    sgd:   lr, momentum (0.9), weight_decay (0)             torch.optim.SGD
    adam:  lr, beta1 (0.9), beta2 (0.999), eps (1e-8), weight_decay (0, added to the
           gradient)                                       torch.optim.Adam
    adamw: the same, weight_decay decoupled (p *= 1 - lr * wd)  torch.optim.AdamW

A value out of range (a negative learning rate, a beta outside [0, 1), a non-finite
number) or not a number (a boolean, as YAML reads an unquoted `yes`) is refused with
the hyperparameter's name. The NumPy perceptron's SGD is checked by the same rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hypersack.core.errors import InvalidInput

OPTIMIZERS = ("sgd", "adam", "adamw")
DEFAULTS: dict[str, float] = {"lr": 0.01, "momentum": 0.9, "weight_decay": 0.0,
                              "beta1": 0.9, "beta2": 0.999, "eps": 1e-8}
USED = {"sgd": ("lr", "momentum", "weight_decay"),
        "adam": ("lr", "beta1", "beta2", "eps", "weight_decay"),
        "adamw": ("lr", "beta1", "beta2", "eps", "weight_decay")}
# Inclusive lower bound, exclusive upper bound (None: unbounded).
_RANGES: dict[str, tuple[float, float | None]] = {
    "lr": (0.0, None), "momentum": (0.0, None), "weight_decay": (0.0, None),
    "beta1": (0.0, 1.0), "beta2": (0.0, 1.0), "eps": (0.0, None)}


def check(name: str) -> str:
    if name not in OPTIMIZERS:
        raise InvalidInput(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")
    return name


def hyperparameters(optimizer: str, params: Mapping[str, Any]) -> dict[str, float]:
    """The optimizer's hyperparameters from a trial's parameters, defaulted and checked."""
    out: dict[str, float] = {}
    for name in USED[check(optimizer)]:
        raw = params.get(name, DEFAULTS[name])
        if isinstance(raw, bool):  # YAML reads an unquoted yes, on or true as one
            raise InvalidInput(f"{name}: a number expected, got {raw!r}")
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise InvalidInput(f"{name}: a number expected, got {raw!r}") from None
        low, high = _RANGES[name]
        if not math.isfinite(value) or value < low or (high is not None and value >= high):
            bound = f"[{low:g}, {high:g})" if high is not None else f">= {low:g}"
            raise InvalidInput(f"{name}: {value!r} out of range ({bound})")
        out[name] = value
    return out
