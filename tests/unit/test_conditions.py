"""Conditional hyperparameters (issue 36, 8): a hyperparameter with `when` exists only
where earlier ones take given values (an optimizer's own parameters where it is chosen).
Grid expansion, random sampling, Optuna's samplers, given parameters and `validate`
all honour it."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hypersack.core.errors import InvalidInput
from hypersack.core.types import TrialRecord, TrialState, WorkloadKey
from hypersack.grid.adaptive import OptunaSearch
from hypersack.grid.expand import expand
from hypersack.grid.params import grid_points, grid_size
from hypersack.grid.space import parse_space

OPTIMIZERS = {
    "optimizer": ["sgd", "adam", "adamw"],
    "lr": {"distribution": "loguniform", "low": 1e-3, "high": 0.1, "num": 2},
    "momentum": {"distribution": "uniform", "low": 0.0, "high": 0.9, "num": 3,
                 "when": {"optimizer": "sgd"}},
    "beta1": {"distribution": "choice", "values": [0.8, 0.9],
              "when": {"optimizer": ["adam", "adamw"]}},
    "weight_decay": {"distribution": "choice", "values": [0.0, 0.01],
                     "when": {"optimizer": "adamw"}},
}


def space(search: dict[str, Any] | None = None, **hps: Any) -> Any:
    return parse_space({"name": "c", "models": ["resnet18", "resnet34"],
                        "hyperparameters": {"batch_size": [64], **OPTIMIZERS, **hps},
                        **({"search": search} if search else {})})


def defined_as_said(params: dict[str, Any]) -> bool:
    opt = params["optimizer"]
    return (("momentum" in params) == (opt == "sgd")
            and ("beta1" in params) == (opt in ("adam", "adamw"))
            and ("weight_decay" in params) == (opt == "adamw"))


def test_the_grid_has_each_optimizers_own_parameters_only() -> None:
    sp = space()
    trials = expand(sp, "c-1")
    # Per model: sgd 2 lr x 3 momentum, adam 2 x 2 beta1, adamw 2 x 2 x 2 decay.
    assert sp.size() == len(trials) == 2 * (6 + 4 + 8)
    assert all(defined_as_said(t.params) for t in trials)
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == len(trials)
    sgd = next(t for t in trials if t.params["optimizer"] == "sgd")
    assert sgd.coords[-2:] == (-1, -1)  # beta1 and weight_decay take no value there


def test_random_search_samples_a_conditional_one_only_where_it_holds() -> None:
    trials = expand(space({"type": "random", "samples": 300, "seed": 4}), "c-1")
    assert all(defined_as_said(t.params) for t in trials)
    assert {t.params["optimizer"] for t in trials} == {"sgd", "adam", "adamw"}


@pytest.mark.parametrize("sampler", ["tpe", "random"])
def test_optuna_asks_a_conditional_one_only_where_it_holds(sampler: str) -> None:
    sp = space({"type": "optuna", "sampler": sampler, "trials": 40, "seed": 1},
               lr={"distribution": "loguniform", "low": 1e-3, "high": 0.1})
    search = OptunaSearch(sp)
    search.rebuild([])
    told: list[TrialRecord] = []
    for _ in range(40):
        number, params = search.ask()
        assert defined_as_said(params), params
        t = TrialRecord(id=f"c-1-t{number:05d}", study_id="c-1", coords=(number,),
                        params=params, key=WorkloadKey(model=params["model"], batch_size=64),
                        epochs=1, state=TrialState.COMPLETED,
                        objective=params["lr"] + params.get("momentum", 0.5))
        search.tell(t)
        told.append(t)
    # A restarted server rebuilds the sampler from the records, conditional ones too.
    again = OptunaSearch(sp)
    again.rebuild(told)
    assert [s for _, s, _ in again.history()] == ["COMPLETE"] * 40
    assert defined_as_said(again.ask()[1])


def test_given_parameters_follow_the_conditions() -> None:
    sp = space({"type": "manual", "trials": 5})
    base = {"model": "resnet18", "batch_size": 64, "lr": 0.01}
    assert sp.point({**base, "optimizer": "sgd", "momentum": 0.5})["momentum"] == 0.5
    with pytest.raises(InvalidInput, match="unknown beta1"):
        sp.point({**base, "optimizer": "sgd", "momentum": 0.5, "beta1": 0.9})
    with pytest.raises(InvalidInput, match="missing beta1"):
        sp.point({**base, "optimizer": "adam"})
    assert "momentum" not in sp.point({**base, "optimizer": "adam", "beta1": 0.9})


@pytest.mark.parametrize(("hps", "message"), [
    ({"x": {"distribution": "choice", "values": [1], "when": {"y": 1}}, "y": [1, 2]},
     "declared before it"),
    ({"x": {"distribution": "choice", "values": [1], "when": {"nope": 1}}},
     "not a hyperparameter"),
    ({"x": {"distribution": "choice", "values": [1], "when": {"optimizer": "rmsprop"}}},
     "when.optimizer"),
    ({"x": {"distribution": "choice", "values": [1], "when": {"model": "vit_tiny"}}},
     "not one of the models"),
    ({"x": {"distribution": "choice", "values": [1], "when": {"optimizer": []}}},
     "no values"),
])
def test_bad_conditions_are_refused_with_the_reason(hps: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        space(**hps)


def test_demand_keys_and_placeholders_cannot_be_conditional() -> None:
    with pytest.raises(InvalidInput, match="demand key"):
        parse_space({"name": "c", "models": ["resnet18"], "hyperparameters": {
            "optimizer": ["sgd", "adam"],
            "batch_size": {"distribution": "choice", "values": [64],
                           "when": {"optimizer": "sgd"}}}})
    with pytest.raises(InvalidInput, match="HYPERSACK_PARAMS"):
        parse_space({"name": "c", "hyperparameters": {
            "opt": ["sgd", "adam"], "momentum": {"distribution": "choice", "values": [0.9],
                                                  "when": {"opt": "sgd"}}},
            "program": {"command": "{python} t.py --momentum {momentum}"}})


def test_the_count_without_expanding_matches_the_expansion() -> None:
    rng = random.Random(7)
    for _ in range(60):
        axes: list[tuple[str, list[Any]]] = []
        hps: dict[str, Any] = {}
        for i in range(rng.randint(1, 5)):
            name = f"p{i}"
            values = list(range(rng.randint(1, 4)))
            when = None
            if axes and rng.random() < 0.6:
                tested, tested_values = rng.choice(axes)
                when = {tested: rng.sample(tested_values, rng.randint(1, len(tested_values)))}
            hps[name] = parse_space({"name": "x", "hyperparameters": {
                **{n: {"distribution": "choice", "values": v} for n, v in axes},
                name: {"distribution": "choice", "values": values,
                       **({"when": when} if when else {})}},
                "program": {"command": "true"}}).hyperparameters[name]
            axes.append((name, values))
        assert grid_size(axes, hps) == len(list(grid_points(axes, hps)))


def test_validate_shows_the_effective_space(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": "c", "models": ["resnet18"], "hyperparameters": {
        "batch_size": [64], **OPTIMIZERS}}))
    out = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "validate", str(path)],
                         capture_output=True, text=True, timeout=60).stdout
    assert "c: 18 trials (grid search)" in out
    assert "momentum: 3 values: 0.0, 0.45, 0.9  (only when optimizer in ['sgd'])" in out
    assert "beta1: 2 values: 0.8, 0.9  (only when optimizer in ['adam', 'adamw'])" in out


def test_the_numpy_perceptron_refuses_what_it_cannot_train() -> None:
    from hypersack.core.errors import HyperSackError
    from hypersack.core.train_options import parse_train_options
    from hypersack.runner.train import train_mlp

    with pytest.raises(HyperSackError, match="not optimizer 'adam'"):
        train_mlp({"optimizer": "adam", "lr": 0.1}, 1.0, parse_train_options({}))


@pytest.mark.parametrize(("params", "fragment"), [
    ({"lr": True}, "lr: a number expected, got True"),  # `lr: [yes, 0.1]` in YAML
    ({"lr": -0.1}, "lr: -0.1 out of range"),
    ({"lr": float("nan")}, "lr: nan out of range"),
    ({"lr": 0.1, "momentum": "fast"}, "momentum: a number expected"),
    ({"lr": 0.1, "weight_decay": -1}, "weight_decay: -1.0 out of range")])
def test_both_trainers_refuse_a_hyperparameter_that_is_no_usable_number(
        params: dict[str, object], fragment: str) -> None:
    from hypersack.core import optim
    from hypersack.core.errors import InvalidInput
    from hypersack.core.train_options import parse_train_options
    from hypersack.runner.train import train_mlp

    with pytest.raises(InvalidInput, match=fragment):
        optim.hyperparameters("sgd", params)
    with pytest.raises(InvalidInput, match=fragment):
        train_mlp(params, 1.0, parse_train_options({}))
