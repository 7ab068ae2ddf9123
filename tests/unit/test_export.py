"""hypersack export --optuna (issue 36, 7): a study written into an Optuna storage reads
back with optuna.load_study trial by trial (parameters, distributions, states, values,
intermediate values, user attributes), and Optuna's own plots work on it."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.export import export_optuna
from hypersack.core.errors import AlreadyExists

SPACE = {"name": "s", "models": ["resnet18"],
         "hyperparameters": {"batch_size": [64],
                             "lr": {"distribution": "loguniform", "low": 1e-4, "high": 1.0},
                             "width": [16, 64]},
         "search": {"type": "optuna", "sampler": "tpe", "trials": 5}}


class Reader:
    """What the exporter reads, as a server or a database file gives it."""

    def __init__(self) -> None:
        self._study = pb.Study(id="s-1", name="s", state="COMPLETED",
                               objective_metric="loss", objective_mode="min",
                               submitted_at=1_700_000_000.0, space_json=json.dumps(SPACE),
                               owner="alice")
        rows = [("s-1-t00000", "COMPLETED", 0.001, 16, 0.25, 5),
                ("s-1-t00001", "PRUNED", 0.5, 64, None, 2),
                ("s-1-t00002", "FAILED", 0.01, 16, None, 0),  # its profile failed
                ("s-1-t00003", "COMPLETED", 0.02, 64, 0.125, 5),
                ("s-1-t00004", "DIVERGED", 0.9, 64, None, 1)]
        self._trials = []
        self._history = pb.History()
        for i, (tid, state, lr, width, objective, epochs) in enumerate(rows):
            ran = epochs > 0
            self._trials.append(pb.Trial(
                id=tid, study_id="s-1", state=state,
                params_json=json.dumps({"model": "resnet18", "batch_size": 64, "lr": lr,
                                        "width": width}),
                has_objective=objective is not None, objective=objective or 0.0,
                metrics={"loss": objective or 1.0}, launches=1 if ran else 0,
                reason="" if state == "COMPLETED" else f"{state.lower()} for a reason",
                started_at=1_700_000_010.0 + i if ran else 0.0,
                finished_at=1_700_000_100.0 + i))
            for step in range(1, epochs + 1):
                self._history.steps.add(trial_id=tid, step=step, at=1.0,
                                        metrics={"loss": 1.0 / step + lr, "acc": 0.5})
            if ran:
                self._history.spans.add(trial_id=tid, attempt=1, node="n0", gpu_index=i % 2,
                                        start=1.0, end=2.0)

    def study(self, study_id: str) -> pb.Study:
        return self._study

    def studies(self) -> list[pb.Study]:
        return [self._study]

    def trials(self, study_id: str) -> list[pb.Trial]:
        return list(self._trials)

    def trial(self, trial_id: str) -> pb.Trial:
        return next(t for t in self._trials if t.id == trial_id)

    def history(self, *, study_id: str = "", trial_id: str = "") -> pb.History:
        return self._history


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_every_trial_reads_back_from_optuna(tmp_path: Path) -> None:
    reader = Reader()
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    counts = export_optuna(reader, "s-1", url)
    assert counts == {"COMPLETE": 2, "PRUNED": 1, "FAIL": 2}
    study = optuna.load_study(study_name="s-1", storage=url)
    assert study.direction == optuna.study.StudyDirection.MINIMIZE
    assert study.user_attrs["hypersack_study"] == "s-1"
    assert len(study.trials) == 5
    expected_state = {"COMPLETED": "COMPLETE", "PRUNED": "PRUNED", "FAILED": "FAIL",
                      "DIVERGED": "FAIL"}
    for ours, theirs in zip(reader.trials("s-1"), study.trials, strict=True):
        params = json.loads(ours.params_json)
        assert theirs.user_attrs["hypersack_trial"] == ours.id
        assert theirs.user_attrs["hypersack_state"] == ours.state
        assert theirs.state.name == expected_state[ours.state]
        assert theirs.params == {"batch_size": 64, "lr": params["lr"],
                                 "width": params["width"]}
        assert theirs.user_attrs["param.model"] == "resnet18"  # one model: no distribution
        assert isinstance(theirs.distributions["lr"], optuna.distributions.FloatDistribution)
        assert theirs.distributions["lr"].log
        assert theirs.distributions["width"].choices == (16, 64)
        assert theirs.value == (ours.objective if ours.has_objective else None)
        curve = {h.step: h.metrics["loss"] for h in reader.history().steps
                 if h.trial_id == ours.id}
        assert theirs.intermediate_values == curve
        assert theirs.user_attrs["attempts"] == ours.launches
        assert theirs.user_attrs["reason"] == ours.reason
        assert theirs.user_attrs["metrics"] == dict(ours.metrics)
        if ours.launches:
            assert theirs.user_attrs["node"] == "n0"
            assert theirs.datetime_start is not None
            assert theirs.datetime_start.timestamp() == pytest.approx(ours.started_at)
    assert study.best_trial.user_attrs["hypersack_trial"] == "s-1-t00003"
    # Optuna's own tools work on it unchanged.
    from optuna.visualization import matplotlib as plots

    assert plots.plot_intermediate_values(study) is not None
    assert plots.plot_optimization_history(study) is not None


def test_an_existing_optuna_study_is_replaced_only_when_asked(tmp_path: Path) -> None:
    reader = Reader()
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    export_optuna(reader, "s-1", url)
    with pytest.raises(AlreadyExists, match="--replace"):
        export_optuna(reader, "s-1", url)
    export_optuna(reader, "s-1", url, replace=True)
    assert len(optuna.load_study(study_name="s-1", storage=url).trials) == 5
    optuna.create_study(study_name="theirs", storage=url)
    with pytest.raises(AlreadyExists, match="--name"):  # not ours: never overwritten
        export_optuna(reader, "s-1", url, name="theirs", replace=True)
    export_optuna(reader, "s-1", url, name="copy")
    assert {s.study_name for s in optuna.get_all_study_summaries(url)} == {
        "s-1", "theirs", "copy"}
