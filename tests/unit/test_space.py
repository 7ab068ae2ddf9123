from __future__ import annotations

from typing import Any

import pytest

from hypersack.core.errors import InvalidInput
from hypersack.grid.expand import expand
from hypersack.grid.space import load_space, parse_space
from hypersack.policies.registry import policy_names
from tests.conftest import EXAMPLES


def space(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "s",
        "models": ["resnet18"],
        "hyperparameters": {"batch_size": [64, 128],
                            "lr": {"distribution": "loguniform", "low": 1e-4, "high": 1e-1,
                                   "num": 4}},
    }
    base.update(over)
    return base


@pytest.mark.parametrize("name,trials", [("sp1", 96), ("sp2", 96), ("sp3", 96), ("sp4", 384)])
def test_paper_spaces_have_the_papers_trial_counts(name: str, trials: int) -> None:
    sp = load_space(EXAMPLES / f"{name}.yaml")
    assert sp.size() == trials
    assert len(expand(sp, f"{name}-1")) == trials


def test_grid_values_of_each_range_kind() -> None:
    sp = parse_space(space(hyperparameters={
        "batch_size": {"distribution": "int", "low": 32, "high": 128, "step": 32},
        "lr": {"distribution": "loguniform", "low": 1e-4, "high": 1e-1, "num": 4},
        "momentum": {"distribution": "uniform", "low": 0.8, "high": 0.95, "step": 0.05},
        "optimizer": ["sgd", "adam"],
    }))
    axes = dict(sp.axes())
    assert axes["batch_size"] == [32, 64, 96, 128]
    assert axes["lr"] == [0.0001, 0.001, 0.01, 0.1]
    assert axes["momentum"] == [0.8, 0.85, 0.9, 0.95]
    assert sp.size() == 1 * 4 * 4 * 4 * 2


@pytest.mark.parametrize("over,fragment", [
    ({"models": ["resnet99"]}, "models.0: unknown model 'resnet99'; valid:"),
    ({"models": ["resnet18", "resnet18"]}, "duplicated models ['resnet18']"),
    ({"models": []}, "models"),
    ({"hyperparameters": {"batch_size": [64],
                          "lr": {"distribution": "uniform", "low": 0.5, "high": 0.1, "num": 3}}},
     "hyperparameters.lr.uniform: empty range: low 0.5 > high 0.1"),
    ({"hyperparameters": {"batch_size": [64],
                          "lr": {"distribution": "loguniform", "low": 0, "high": 0.1, "num": 3}}},
     "loguniform needs low > 0"),
    ({"hyperparameters": {"batch_size": [64], "lr": []}}, "hyperparameters.lr.choice.values"),
    ({"hyperparameters": {"batch_size": [64, 64]}}, "duplicated values"),
    ({"hyperparameters": {"lr": [0.1]}}, "hyperparameters.batch_size: required"),
    ({"hyperparameters": {"batch_size": [64],
                          "lr": {"distribution": "uniform", "low": 0.1, "high": 0.5}}},
     "hyperparameters.lr: grid search needs num"),
    ({"hyperparameters": {"batch_size": [64], "lr": {"distribution": "gaussian"}}},
     "hyperparameters.lr"),
    ({"settings": {"max_trials": 3}}, "8 trials, more than settings.max_trials=3"),
    ({"settings": {"policy": "best"}},
     "unknown policy 'best'; valid: predict, auto, ff, ffd, wf, wfd, eft, pack, optimal"),
    ({"settings": {"oversubscription": {"A100": -1}}}, "settings.oversubscription"),
    ({"search": {"type": "random"}}, "random search needs samples"),
    ({"extra": 1}, "extra: unknown key"),
    # A key in the wrong section is pointed to the one that takes it; a misspelt one to
    # its spelling.
    ({"settings": {"preload": ["torch"]}}, "settings.preload: unknown key; it belongs in "
                                            "program.preload"),
    ({"oversubscription": {"A100": 2}}, "unknown key; it belongs in settings.oversubscription"),
    ({"program": {"builtin": "train", "epochs": 3}},
     "program.epochs: unknown key; it belongs in settings.epochs"),
    ({"settings": {"epoch": 3}}, "settings.epoch: unknown key; did you mean epochs?"),
    ({"hyperparameters": {"batch_size": [64], "optimizer": ["sgd", "lamb"]}},
     "the built-in trainer has no 'lamb'; valid: sgd, adam, adamw"),
    ({"name": "has space"}, "name"),
])
def test_bad_input_names_the_field_and_reason(over: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidInput) as err:
        parse_space(space(**over), source="s.yaml", policies=policy_names())
    assert fragment in str(err.value)
    assert str(err.value).startswith("s.yaml: ")


def test_duplicated_yaml_keys_are_rejected(tmp_path: Any) -> None:
    f = tmp_path / "dup.yaml"
    f.write_text("name: a\nmodels: [resnet18]\nhyperparameters:\n  batch_size: [64]\n"
                 "  batch_size: [128]\n")
    with pytest.raises(InvalidInput, match="duplicated key 'batch_size'"):
        load_space(f)


@pytest.mark.parametrize(("written", "fusion"), [
    ("on", "on"), ("off", "off"), ("On", "on"), ("OFF", "off"), ("true", "on"),
    ("false", "off"), ("yes", "on"), ("no", "off"), ('"on"', "on"), ("auto", "auto")])
def test_fusion_written_unquoted_in_yaml_is_the_switch_meant(tmp_path: Any, written: str,
                                                              fusion: str) -> None:
    # YAML 1.1 reads an unquoted `on` or `off` as a boolean: as the docs write it,
    # `fusion: on` must be taken, not refused as a boolean.
    f = tmp_path / "s.yaml"
    f.write_text("name: a\nmodels: [resnet18]\nhyperparameters:\n  batch_size: [64]\n"
                 f"settings: {{fusion: {written}}}\n")
    assert load_space(f).settings.fusion == fusion


def test_fusion_other_values_are_refused(tmp_path: Any) -> None:
    for written in ("1", "maybe", "[on]"):
        f = tmp_path / "s.yaml"
        f.write_text("name: a\nmodels: [resnet18]\nhyperparameters:\n  batch_size: [64]\n"
                     f"settings: {{fusion: {written}}}\n")
        with pytest.raises(InvalidInput, match=r"settings\.fusion"):
            load_space(f)


def test_a_date_in_yaml_is_the_string_written(tmp_path: Any) -> None:
    # YAML 1.1 reads 2026-11-29 as a date, which no field takes: a study named by its
    # day was refused with "name: Input should be a valid string".
    f = tmp_path / "s.yaml"
    f.write_text("name: 2026-11-29\nmodels: [resnet18]\nhyperparameters:\n"
                 "  batch_size: [64]\n  tag: [2026-11-29, 2001-12-14t21:59:43.10-05:00]\n")
    space = load_space(f)
    assert space.name == "2026-11-29"
    assert [t.params["tag"] for t in expand(space, "d-1")] == ["2026-11-29",
                                                         "2001-12-14t21:59:43.10-05:00"]


def test_missing_file_and_bad_yaml(tmp_path: Any) -> None:
    with pytest.raises(InvalidInput, match="does not exist"):
        load_space(tmp_path / "none.yaml")
    f = tmp_path / "bad.yaml"
    f.write_text("name: [unclosed\n")
    with pytest.raises(InvalidInput, match="not valid YAML"):
        load_space(f)


def test_random_search_is_seeded_and_within_ranges() -> None:
    raw = space(search={"type": "random", "samples": 50, "seed": 7}, hyperparameters={
        "batch_size": [32, 64],
        "lr": {"distribution": "loguniform", "low": 1e-4, "high": 1e-1},
        "wd": {"distribution": "uniform", "low": 0.0, "high": 0.1},
        "layers": {"distribution": "int", "low": 2, "high": 8, "step": 2},
    })
    a = expand(parse_space(raw), "r-1")
    b = expand(parse_space(raw), "r-1")
    assert [t.params for t in a] == [t.params for t in b]
    assert len(a) == 50
    for t in a:
        assert 1e-4 <= t.params["lr"] <= 1e-1
        assert 0.0 <= t.params["wd"] <= 0.1
        assert t.params["layers"] in (2, 4, 6, 8)
    other = expand(parse_space({**raw, "search": {"type": "random", "samples": 50, "seed": 8}}),
                   "r-1")
    assert [t.params for t in other] != [t.params for t in a]


def test_expansion_ids_are_stable_and_keys_follow_params(sp1: Any) -> None:
    trials = expand(sp1, "sp1-3")
    assert trials[0].id == "sp1-3-t00000" and trials[-1].id == "sp1-3-t00095"
    assert [t.id for t in trials] == [t.id for t in expand(sp1, "sp1-3")]
    t = trials[17]
    assert t.key.model == t.params["model"] and t.key.batch_size == t.params["batch_size"]
    assert t.key.optimizer == "sgd" and t.key.fusion_width == 1
    assert len({t.coords for t in trials}) == 96


def test_expanded_trials_share_their_workloads_keys_and_each_key_is_its_own() -> None:
    """expand builds a workload's key once; every trial's key still equals the one
    workload_key gives it alone (demand keys, a command's model, the default keys)."""
    from hypersack.grid.expand import expand, workload_key

    spaces = [
        parse_space({"name": "a", "models": ["resnet18", "vit_tiny"],
                     "hyperparameters": {"batch_size": [64, 128], "lr": [0.1, 0.01, 1]}}),
        parse_space({"name": "b", "models": ["resnet18", "vit_tiny"],
                     "hyperparameters": {"batch_size": [64, 128], "width": [1, 1.0, 2]},
                     "settings": {"demand_keys": ["width"]}}),
        parse_space({"name": "c", "models": ["resnet18", "vit_tiny"],
                     "hyperparameters": {"lr": [0.1, 0.2]},
                     "program": {"command": "{python} train.py --model {model}"}}),
    ]
    for space in spaces:
        trials = expand(space, f"{space.name}-1")
        for t in trials:
            assert t.key == workload_key(space, t.params, study_id=f"{space.name}-1")
        # Shared: one object per workload (1 and 1.0 are two entries of one key).
        assert len({t.key for t in trials}) <= len({id(t.key) for t in trials}) < len(trials)
