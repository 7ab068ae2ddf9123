"""Expansion of a search space into trials with stable ids."""

from __future__ import annotations

import itertools
import math
import random
from typing import Any

from hypersack.core.types import TrialRecord, WorkloadKey
from hypersack.grid.space import Choice, IntRange, LogUniform, SearchSpace, Uniform


def trial_id(study_id: str, ordinal: int) -> str:
    """Stable: the same study and point always give the same id."""
    return f"{study_id}-t{ordinal:05d}"


def workload_key(params: dict[str, Any], fusion_width: int = 1) -> WorkloadKey:
    return WorkloadKey(
        model=str(params["model"]),
        batch_size=int(params["batch_size"]),
        optimizer=str(params.get("optimizer", "sgd")),
        precision=str(params.get("precision", "fp32")),
        fusion_width=fusion_width,
    )


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
    if space.search.type == "grid":
        axes = space.axes()
        names = [name for name, _ in axes]
        ranges = [range(len(values)) for _, values in axes]
        for ordinal, coords in enumerate(itertools.product(*ranges)):
            params = {names[a]: axes[a][1][i] for a, i in enumerate(coords)}
            trials.append(_trial(study_id, ordinal, tuple(coords), params, epochs))
    else:
        rng = random.Random(space.search.seed)
        assert space.search.samples is not None
        for ordinal in range(space.search.samples):
            drawn: dict[str, Any] = {"model": space.models[rng.randrange(len(space.models))]}
            for name, hp in space.hyperparameters.items():
                drawn[name] = _sample(hp, rng)
            trials.append(_trial(study_id, ordinal, (ordinal,), drawn, epochs))
    return trials


def _trial(study_id: str, ordinal: int, coords: tuple[int, ...], params: dict[str, Any],
           epochs: float) -> TrialRecord:
    trial_epochs = float(params.get("epochs", epochs))
    return TrialRecord(
        id=trial_id(study_id, ordinal),
        study_id=study_id,
        coords=coords,
        params=params,
        key=workload_key(params),
        epochs=trial_epochs,
    )
