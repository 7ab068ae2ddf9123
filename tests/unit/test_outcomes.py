"""Honest outcomes: a diverged trial stops at once and frees its GPU, a study none of
whose trials completed is FAILED, a missing objective metric is said once, and the CLI
exits non-zero for a study that did not complete."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from hypersack.cli.main import main
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import InvalidInput, StaleEvent
from hypersack.core.types import StudyState, TrialState
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    KillTrial,
    NodeJoined,
    StudySubmitted,
    TrialFailed,
    TrialFinished,
    TrialProgress,
)
from hypersack.testing.core import launches, make
from hypersack.wire.convert import clean_metrics, nonfinite_names


def study(n: int = 2, **settings: Any) -> Any:
    return parse_space({
        "name": "o", "models": ["resnet18"],
        "hyperparameters": {"batch_size": [64], "lr": [0.1 * (i + 1) for i in range(n)]},
        # One trial per GPU: the second waits until the first frees the GPU.
        "settings": {"retries": 0, "policy": "ff", "oversubscription": {"A100": 0.6},
                     "fusion": "off", **settings},
    })


def setup(n: int = 2, **settings: Any) -> tuple[Any, Any, list[Any]]:
    orch, store, _ = make()
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    first = launches(orch.handle(StudySubmitted(study(n, **settings))))
    return orch, store, first


@pytest.mark.parametrize("metrics,nonfinite,why", [
    ({}, ("loss",), "loss is NaN or infinite"),
    ({"loss": 9.8e10}, (), "above stop_if 1e+06"),
    ({"loss": 0.5, "acc": 0.01}, (), "below stop_if 0.05"),
])
def test_a_diverged_trial_stops_at_once_and_frees_its_gpu(
        metrics: dict[str, float], nonfinite: tuple[str, ...], why: str) -> None:
    orch, store, (first,) = setup(stop_if={"loss": {"above": 1e6}, "acc": {"below": 0.05}})
    commands = orch.handle(TrialProgress(first.trial_id, "node0", 3, metrics,
                                         nonfinite=nonfinite))
    kills = [c for c in commands if isinstance(c, KillTrial)]
    assert [(k.trial_id, k.attempt) for k in kills] == [(first.trial_id, 1)]
    assert why in kills[0].reason
    t = store.get_trial(first.trial_id)
    assert t.state == TrialState.DIVERGED and why in t.reason and t.objective is None
    # Its GPU went to the next trial in the same decision.
    assert [c.trial_id for c in launches(commands)] != []
    # The kill's exit is stale: it changes nothing more.
    with pytest.raises(StaleEvent):
        orch.handle(TrialFailed(first.trial_id, "node0", 137, attempt=1))
    assert store.get_trial(first.trial_id).state == TrialState.DIVERGED


def test_a_non_finite_objective_at_the_end_is_diverged_not_completed() -> None:
    orch, store, (first,) = setup(n=1)
    orch.handle(TrialFinished(first.trial_id, "node0", {"acc": 0.9}, nonfinite=("loss",)))
    t = store.get_trial(first.trial_id)
    assert t.state == TrialState.DIVERGED and t.objective is None
    assert orch.study(t.study_id).state == StudyState.FAILED  # none completed


def test_a_study_fails_only_when_no_trial_completed() -> None:
    orch, store, (first,) = setup(n=2)
    (second,) = launches(orch.handle(TrialFailed(first.trial_id, "node0", 1, "boom")))
    orch.handle(TrialFinished(second.trial_id, "node0", {"loss": 0.3}))
    sid = store.get_trial(first.trial_id).study_id
    assert orch.study(sid).state == StudyState.COMPLETED  # partial failure: it says so


def test_a_missing_objective_is_flagged_and_the_study_warns_once() -> None:
    """With settings.allow_missing_objective, trials without it complete, and the study
    warns once."""
    orch, store, (first,) = setup(n=2, allow_missing_objective=True)
    (second,) = launches(orch.handle(TrialFinished(first.trial_id, "node0",
                                                   {"val_loss": 0.2, "epoch": 3})))
    orch.handle(TrialFinished(second.trial_id, "node0", {"val_loss": 0.1}))
    t = store.get_trial(first.trial_id)
    assert t.state == TrialState.COMPLETED and t.objective is None
    assert "'loss'" in t.reason and "epoch, val_loss" in t.reason
    s = store.get_study(t.study_id)
    assert len(s.warnings) == 1 and "val_loss" in s.warnings[0]
    assert s.state == StudyState.COMPLETED


@pytest.mark.parametrize("report", ["progress", "exit"])
def test_a_missing_objective_stops_the_study_at_the_first_report(report: str) -> None:
    """Issue 36: `objective: {metric: val_los}` ran every trial to its end, and taught
    the search nothing. Now the first report without it stops the study, and says
    which metrics the trials do report."""
    orch, store, (first,) = setup(n=4)
    sid = store.get_trial(first.trial_id).study_id
    event = (TrialProgress(first.trial_id, "node0", 1, {"val_loss": 0.2, "acc": 0.5})
             if report == "progress" else
             TrialFinished(first.trial_id, "node0", {"val_loss": 0.2, "acc": 0.5}))
    commands = orch.handle(event)
    assert not launches(commands)  # nothing more runs
    t = store.get_trial(first.trial_id)
    assert t.state == TrialState.FAILED and "acc, val_loss" in t.reason
    assert "settings.allow_missing_objective" in t.reason
    study = orch.study(sid)
    assert study.state == StudyState.FAILED
    assert any("stopped: trial" in w and "'loss'" in w for w in study.warnings)
    assert {x.state for x in orch.trials(sid)} == {TrialState.FAILED, TrialState.CANCELLED}
    if report == "progress":
        assert [c.trial_id for c in commands if isinstance(c, KillTrial)] == [first.trial_id]
    # A trial that reports no metrics at all is not taken for a misspelt objective.
    orch2, store2, (other,) = setup(n=2)
    orch2.handle(TrialFinished(other.trial_id, "node0", {}))
    assert store2.get_trial(other.trial_id).state == TrialState.COMPLETED


def test_stop_if_bounds_are_validated() -> None:
    with pytest.raises(InvalidInput, match="above, below"):
        study(stop_if={"loss": {}})
    with pytest.raises(InvalidInput):
        study(stop_if={"loss": {"above": math.inf}})
    with pytest.raises(InvalidInput):
        study(stop_if={"bad name!": {"above": 1}})


def test_non_finite_metrics_are_named_not_stored() -> None:
    values = {"loss": math.nan, "acc": 0.5, "x": -math.inf}
    assert clean_metrics(values) == {"acc": 0.5}
    assert nonfinite_names(values) == ("loss", "x")


FAIL = """
name: broken
models: [resnet18]
hyperparameters: {{batch_size: [64], lr: [0.1, 0.2]}}
settings: {{retries: 0, epochs: 1}}
program: {{command: '{{python}} {script}'}}
"""


def test_run_exits_non_zero_when_no_trial_completed(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "crash.py"
    script.write_text("raise SystemExit(3)\n")
    space = tmp_path / "broken.yaml"
    space.write_text(FAIL.format(script=script))
    code = main(["run", str(space), "--backend", "fake", "--inventory", "1xA100-80GB",
                 "--state-dir", str(tmp_path / "st"), "--profiles",
                 str(Path(__file__).parents[2] / "examples" / "profiles-estimates.yaml")])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "broken-1: FAILED" in out and "none of its 2 trials completed" in out
