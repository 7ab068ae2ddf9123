"""Expansion of a search space into trials with stable ids."""

from __future__ import annotations

import hashlib
import math
import random
import re
from typing import Any

from hypersack.core.trial_env import as_text
from hypersack.core.types import KEY_VALUE_CHARS, STATED_KEY, TrialRecord, WorkloadKey
from hypersack.grid.params import Choice, IntRange, LogUniform, Uniform, active, grid_points
from hypersack.grid.space import KEY_PARAMS, SearchSpace

_UNSAFE = re.compile(f"[^{KEY_VALUE_CHARS}]")


def trial_id(study_id: str, ordinal: int) -> str:
    """Stable: the same study and point always give the same id."""
    return f"{study_id}-t{ordinal:05d}"


def workload_key(space: SearchSpace, params: dict[str, Any], fusion_width: int = 1,
                 study_id: str = "") -> WorkloadKey:
    """What decides a trial's demand. A built-in program's workload is its zoo model; a
    command program's is the study's `workload` (default: a hash of the command), so one
    program's profiles never mix with another's or with a zoo model's. The demand keys
    (`settings.demand_keys`; default batch size, optimizer, precision, and the model of
    a command program) complete it."""
    command = space.program.command is not None
    keys = space.settings.demand_keys
    if keys is None:
        keys = [k for k in KEY_PARAMS if k in params] + (["model"] if command and
                                                         "model" in params else [])
    pairs = [(k, as_key_text(params[k])) for k in dict.fromkeys(keys)
             if k not in KEY_PARAMS and not (k == "model" and not command) and k in params]
    if space.settings.demand is not None and study_id:
        # A stated demand is the study's own: its profiles never stand for (or replace)
        # a measured, imported or another study's profile of the same workload.
        pairs.append((STATED_KEY, as_key_text(study_id)))
    extra = tuple(sorted(pairs))
    return WorkloadKey(
        model=(space.workload or space.program.identity()) if command else str(params["model"]),
        batch_size=int(params["batch_size"]) if "batch_size" in keys and "batch_size" in params
        else 0,
        optimizer=str(params.get("optimizer", "sgd")) if "optimizer" in keys else "sgd",
        precision=str(params.get("precision", "fp32")) if "precision" in keys else "fp32",
        fusion_width=fusion_width,
        params=extra,
    )


def as_key_text(value: Any) -> str:
    """A demand key's value in a workload key: whole floats as integers, like commands."""
    text = as_text(value)
    safe = _UNSAFE.sub("_", text)
    if safe == text and 0 < len(text) <= 64:
        return text
    # Other characters, or a long value: readable, and still told apart by a digest.
    return safe[:48] + "@" + hashlib.sha256(text.encode()).hexdigest()[:12]


def _sample(hp: Choice | Uniform | LogUniform | IntRange, rng: random.Random) -> Any:
    if isinstance(hp, Choice):
        return hp.values[rng.randrange(len(hp.values))]
    if isinstance(hp, IntRange):
        return rng.randrange(hp.low, hp.high + 1, hp.step)
    if isinstance(hp, LogUniform):
        return float(f"{math.exp(rng.uniform(math.log(hp.low), math.log(hp.high))):.6g}")
    return float(f"{rng.uniform(hp.low, hp.high):.6g}")


def expand(space: SearchSpace, study_id: str) -> list[TrialRecord]:
    """Every point of the space as a PENDING trial, in a deterministic order.

    Grid search: the Cartesian product of models and each hyperparameter's values; each
    trial's `coords` index those axes. Random search: `samples` points drawn with `seed`;
    `coords` is the sample number.
    """
    epochs = space.settings.epochs
    trials: list[TrialRecord] = []
    if space.search.adaptive:
        return trials  # asked of the sampler as capacity frees (see `grid.adaptive`)
    # Trials of one workload share one key (immutable): built once per workload, not
    # once per trial (a 50,000-trial study has a few dozen).
    keys: dict[tuple[str, ...], WorkloadKey] = {}
    if space.search.type == "grid":
        points = grid_points(space.axes(), space.hyperparameters)
        for ordinal, (coords, params) in enumerate(points):
            trials.append(_trial(space, study_id, ordinal, coords, params, epochs, keys))
    else:
        rng = random.Random(space.search.seed)
        assert space.search.samples is not None
        for ordinal in range(space.search.samples):
            drawn: dict[str, Any] = (
                {"model": space.models[rng.randrange(len(space.models))]} if space.models
                else {})
            for name, hp in space.hyperparameters.items():
                if active(hp, drawn):  # a conditional one only where its `when` holds
                    drawn[name] = _sample(hp, rng)
            trials.append(_trial(space, study_id, ordinal, (ordinal,), drawn, epochs, keys))
    return trials


def asked_trial(space: SearchSpace, study_id: str, ordinal: int, params: dict[str, Any]
                ) -> TrialRecord:
    """A trial an adaptive search asked for: its ordinal is its number in the search."""
    return _trial(space, study_id, ordinal, (ordinal,), params, space.settings.epochs)


def _trial(space: SearchSpace, study_id: str, ordinal: int, coords: tuple[int, ...],
           params: dict[str, Any], epochs: float,
           keys: dict[tuple[str, ...], WorkloadKey] | None = None) -> TrialRecord:
    trial_epochs = float(params.get("epochs", epochs))
    key = None
    if keys is not None:
        # What workload_key reads of the parameters (the demand keys, or the default
        # ones, and the model), as text: equal texts, equal keys.
        wanted = (*(space.settings.demand_keys or KEY_PARAMS), "model")
        seen = tuple(f"{k}={params[k]!r}:{type(params[k]).__name__}" if k in params else k
                     for k in wanted)
        key = keys.get(seen)
        if key is None:
            key = keys[seen] = workload_key(space, params, study_id=study_id)
    return TrialRecord(
        id=trial_id(study_id, ordinal),
        study_id=study_id,
        coords=coords,
        params=params,
        key=key or workload_key(space, params, study_id=study_id),
        epochs=trial_epochs,
    )
