"""A trial's `seed` hyperparameter (a search over seeds: `seed: [0, 1, 2]`) seeds its
model's initialisation, plain or fused alike; the data order follows the program's
`options.seed`. The plain trainer ignored the hyperparameter (every trial of a seed
search trained the same model) while a fused group honoured it, so a trial's result
depended on whether it was fused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hypersack.core import trial_env as sdk
from hypersack.core.errors import InvalidInput
from hypersack.core.train_options import MAX_SEED, parse_train_options, trial_seed
from hypersack.grid.runnable import check_runnable
from hypersack.grid.space import parse_space

SYNTHETIC = {"dataset": "synthetic", "train_samples": 16, "val_samples": 8, "augment": False}


def _plain(tmp: Path, params: dict[str, Any], options: dict[str, Any]) -> list[float]:
    """The plain trainer's validation losses, per epoch."""
    tmp.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, sdk.ENV_PARAMS: json.dumps(params), sdk.ENV_EPOCHS: "1",
           sdk.ENV_OPTIONS: json.dumps(options), sdk.ENV_METRICS: str(tmp / "m.jsonl")}
    done = subprocess.run([sys.executable, "-m", "hypersack.runner.train"], env=env,
                          capture_output=True, text=True, timeout=240, cwd=tmp)
    assert done.returncode == 0, done.stderr
    return _losses(tmp / "m.jsonl")


def _losses(path: Path) -> list[float]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r["metrics"]["loss"] for r in rows if "metrics" in r]


def test_the_numpy_trainer_seeds_its_weights_from_the_seed_hyperparameter(
        tmp_path: Path) -> None:
    base = {"model": "digits_mlp", "lr": 0.05, "batch_size": 64}
    one = _plain(tmp_path / "a", {**base, "seed": 1}, {})
    assert one == _plain(tmp_path / "b", {**base, "seed": 1}, {})
    assert one != _plain(tmp_path / "c", {**base, "seed": 2}, {})  # before: equal
    # The program's seed orders the data (the hyperparameter seeds the weights only).
    assert one != _plain(tmp_path / "d", {**base, "seed": 1}, {"seed": 7})
    # Where both are the same seed, the run is the program seed's alone (one stream).
    assert _plain(tmp_path / "e", {**base, "seed": 3}, {"seed": 3}) == \
        _plain(tmp_path / "f", base, {"seed": 3})


def test_a_seeded_trial_trains_alike_plain_and_fused(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from hypersack.agent.groups import fused_spec
    from hypersack.core.types import WorkloadKey

    params = [{"model": "bert_tiny", "lr": 0.0, "batch_size": 8, "seed": s} for s in (3, 4)]
    plain = [_plain(tmp_path / f"p{k}", p, SYNTHETIC) for k, p in enumerate(params)]
    # Learning rate 0: each loss is its initial model's on the same batches. Before,
    # both plain trials evaluated the seed-0 model (and the fused members did not).
    assert plain[0][0] != pytest.approx(plain[1][0], rel=1e-3)
    key = WorkloadKey(model="bert_tiny", batch_size=8)
    members = [(f"t{k}", p, tmp_path / f"t{k}.jsonl", None) for k, p in enumerate(params)]
    spec = fused_spec(key, 1, SYNTHETIC, members)
    assert [m["seed"] for m in spec["members"]] == [3, 4]
    done = subprocess.run([sys.executable, "-m", "hypersack.runner.fused_train"],
                          env={**os.environ, sdk.ENV_FUSED: json.dumps(spec)},
                          capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for k in range(2):
        assert _losses(tmp_path / f"t{k}.jsonl") == pytest.approx(plain[k], rel=1e-5)


def test_the_rule_and_its_refusals() -> None:
    assert trial_seed(7, {}) == 7
    assert trial_seed(7, {"seed": 2}) == 2
    assert trial_seed(0, {"seed": 5.0}) == 5  # a whole float (YAML `5.0`)
    for bad in (-1, 1.5, True, "3", None, MAX_SEED + 1, float("nan")):
        with pytest.raises(InvalidInput, match="seed: an integer from 0 to 2"):
            trial_seed(0, {"seed": bad})
    with pytest.raises(InvalidInput, match=r"program\.options: seed"):
        parse_train_options({"seed": -1})
    with pytest.raises(InvalidInput, match=r"program\.options: seed"):
        parse_train_options({"seed": 2**64})  # torch.manual_seed refuses it as a trial starts


@pytest.mark.parametrize(("seed", "fragment"), [
    ([0, -1], "seed: an integer from 0"),
    ([1, 2.5], "seed: an integer from 0"),
    ([True, False], "seed: an integer from 0"),
    ([MAX_SEED + 1], "seed: an integer from 0"),
    ({"distribution": "uniform", "low": 0, "high": 10, "num": 3}, "not uniform"),
    ({"distribution": "int", "low": -5, "high": 3}, "seed: an integer from 0")])
def test_a_study_whose_seeds_would_fail_each_trial_is_refused_at_submission(
        seed: Any, fragment: str) -> None:
    space = parse_space({"name": "s", "models": ["resnet18"],
                         "program": {"builtin": "train", "options": {"dataset": "synthetic"}},
                         "hyperparameters": {"batch_size": [64], "lr": [0.1], "seed": seed}})
    with pytest.raises(InvalidInput, match=fragment) as got:
        check_runnable(space, "s.yaml")
    assert "hyperparameters.seed" in str(got.value)


def test_good_seeds_pass() -> None:
    for seed in ([0, 1, 2], {"distribution": "int", "low": 0, "high": 9}, [MAX_SEED]):
        hps = {"batch_size": [64], "lr": [0.1], "seed": seed}
        check_runnable(parse_space({"name": "s", "models": ["resnet18"],
                                    "hyperparameters": hps}), "s")
