"""Multi-objective studies (issue 36, 8): several metrics with directions, Optuna's
multi-objective samplers told every value, the Pareto front in results, the Python API
and the Optuna export; pruning and single-objective samplers refused with a clear line;
a trial that ends without one of the objectives stops the study."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from hypersack.cli.api import Results, _study, _trial
from hypersack.cli.export import export_optuna
from hypersack.cli.offline import StoreReader
from hypersack.cli.results import goals, pareto, print_results, ranked
from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import InvalidInput
from hypersack.core.pareto import dominates, front
from hypersack.core.types import StudyState, TrialState
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    NodeJoined,
    Orchestrator,
    OrchestratorConfig,
    StudySubmitted,
    TrialFinished,
    TrialProgress,
)
from hypersack.orchestrator.commands import Command, launched
from hypersack.store import SqliteStore

OBJECTIVES = [{"metric": "err", "mode": "min"}, {"metric": "speed", "mode": "max"}]


def make_space(search: dict[str, Any] | None = None, **settings_: Any) -> Any:
    data: dict[str, Any] = {
        "name": "mo", "models": ["resnet18"],
        "hyperparameters": {"batch_size": [64], "lr": {
            "distribution": "loguniform", "low": 1e-4, "high": 1.0}},
        "settings": {"epochs": 2, "policy": "ff", "objectives": OBJECTIVES,
                     "demand": {"compute_pct": 100, "memory_mib": 1000, "epoch_s": 10},
                     **settings_}}
    if search is not None:
        data["search"] = search
    return parse_space(data)


def measured(lr: float) -> dict[str, float]:
    """A real trade-off: a higher learning rate is faster and worse."""
    x = math.log10(lr)
    return {"err": (x + 4) ** 2, "speed": x + 4, "loss": 1.0}


# ----------------------------------------------------------------- the space
def test_objectives_parse_and_the_first_is_the_objective() -> None:
    sp = make_space({"type": "optuna", "trials": 3})
    assert sp.settings.multi_objective
    assert [(o.metric, o.mode) for o in sp.settings.goals] == [("err", "min"),
                                                               ("speed", "max")]
    assert sp.settings.objective.metric == "err"
    # The space as stored reads back the same.
    assert parse_space(sp.model_dump(mode="json")) == sp
    assert not parse_space({"name": "x", "models": ["resnet18"],
                            "hyperparameters": {"batch_size": [64]}}).settings.multi_objective


@pytest.mark.parametrize("change, expected", [
    ({"pruner": {"type": "asha"}}, "cannot prune"),
    ({"search": {"type": "optuna", "trials": 3, "sampler": "cmaes"}}, "takes one objective"),
    ({"settings": {"objectives": [{"metric": "a"}, {"metric": "a", "mode": "max"}]}},
     "given twice"),
    ({"settings": {"objectives": [{"metric": "a"}]}}, "at least 2"),
    ({"settings": {"objective": {"metric": "b"},
                   "objectives": [{"metric": "a"}, {"metric": "b"}]}}, "not both"),
    ({"settings": {"objectives": [{"metric": "a", "mode": "up"}, {"metric": "b"}]}}, "mode"),
])
def test_what_a_multi_objective_study_cannot_do_is_refused(change: dict[str, Any],
                                                           expected: str) -> None:
    data: dict[str, Any] = {"name": "mo", "models": ["resnet18"],
                            "hyperparameters": {"batch_size": [64], "lr": [0.1, 0.01]},
                            "settings": {"epochs": 4, "objectives": OBJECTIVES}}
    data.update(change)
    with pytest.raises(InvalidInput, match=expected):
        parse_space(data)


# ----------------------------------------------------------------- the front, pure
@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.tuples(st.integers(0, 6), st.integers(0, 6),
                                               st.integers(0, 6))), max_size=30),
       st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_the_front_is_exactly_the_points_nothing_dominates(
        points: list[tuple[int, int, int] | None], maximize: tuple[bool, bool, bool]) -> None:
    signs = [-1 if m else 1 for m in maximize]

    def signed(p: tuple[int, ...]) -> list[float]:
        return [s * v for s, v in zip(signs, p, strict=True)]

    expected = [i for i, p in enumerate(points) if p is not None and not any(
        q is not None and dominates(signed(q), signed(p)) for q in points)]
    assert front([None if p is None else [float(v) for v in p] for p in points],
                 list(maximize)) == expected


def test_equal_points_share_the_front() -> None:
    assert front([[1.0, 1.0], [1.0, 1.0], [2.0, 2.0]], [False, False]) == [0, 1]
    assert front([[1.0, 5.0], [2.0, 4.0], [3.0, 4.0]], [False, True]) == [0]


# ----------------------------------------------------------------- the core
class Cluster:
    def __init__(self, db: Path) -> None:
        self.store = SqliteStore(db)
        self.clock = ManualClock(1_700_000_000.0)
        self.orch = Orchestrator(self.store, self.clock, OrchestratorConfig(fusion=False))
        self.running: dict[str, Any] = {}
        self.apply(self.orch.handle(NodeJoined(parse_shorthand("1x2xA100-80GB").nodes[0])))

    def apply(self, commands: list[Command]) -> None:
        for c in launched(commands):
            self.running[c.trial_id] = c

    def run(self, report: Any = measured) -> None:
        for _ in range(400):
            if not self.running:
                return
            tid, c = sorted(self.running.items())[0]
            del self.running[tid]
            if self.orch.s.trials[tid].state != TrialState.RUNNING:
                continue  # killed (its study stopped)
            self.clock.advance(1.0)
            metrics = report(float(c.params["lr"]))
            self.apply(self.orch.handle(TrialProgress(tid, c.node, 1, metrics,
                                                      attempt=c.attempt)))
            if self.orch.s.trials[tid].state != TrialState.RUNNING:
                continue
            self.apply(self.orch.handle(TrialFinished(tid, c.node, metrics,
                                                      attempt=c.attempt)))
        raise AssertionError("still running")


@pytest.mark.parametrize("sampler", ["tpe", "nsga2", "random"])
def test_a_multi_objective_optuna_study_is_told_every_value(tmp_path: Path,
                                                            sampler: str) -> None:
    c = Cluster(tmp_path / "h.db")
    c.apply(c.orch.handle(StudySubmitted(make_space(
        {"type": "optuna", "trials": 10, "sampler": sampler, "seed": 2}))))
    sid = c.orch.studies()[0].id
    c.run()
    trials = c.orch.trials(sid)
    assert c.orch.study(sid).state == StudyState.COMPLETED
    assert len(trials) == 10 and all(t.state == TrialState.COMPLETED for t in trials)
    history = c.orch.searches.search(sid).history()
    assert [(n, s) for n, s, _ in history] == [(i, "COMPLETE") for i in range(10)]
    for (_, _, values), t in zip(history, trials, strict=True):
        assert values == [t.metrics["err"], t.metrics["speed"]]
    # A rebuilt sampler (a restart) holds the same values.
    c.orch.s.searches[sid].stale = True
    assert c.orch.searches.search(sid).history() == history


def test_results_show_the_pareto_front_in_every_form(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]
                                                     ) -> None:
    db = tmp_path / "h.db"
    c = Cluster(db)
    sp = parse_space({"name": "mo", "models": ["resnet18"],
                      "hyperparameters": {"batch_size": [64],
                                          "lr": [1e-4, 1e-3, 1e-2, 0.1, 0.3]},
                      "settings": {"epochs": 2, "policy": "ff", "objectives": OBJECTIVES,
                                   "demand": {"compute_pct": 100, "memory_mib": 1000,
                                              "epoch_s": 10}}})
    c.apply(c.orch.handle(StudySubmitted(sp)))
    sid = c.orch.studies()[0].id

    def report(lr: float) -> dict[str, float]:
        out = measured(lr)
        if lr == 0.1:  # beaten on both by lr 0.3: off the front
            out["err"] = 99.0
        return out

    c.run(report)
    c.store.close()
    with StoreReader(db) as reader:
        study, trials = reader.study(sid), reader.trials(sid)
        on_front = pareto(study, trials)
        lr_of = {t.id: json.loads(t.params_json)["lr"] for t in trials}
        assert sorted(lr_of[i] for i in on_front) == [1e-4, 1e-3, 1e-2, 0.3]
        order = [lr_of[t.id] for t in ranked(study, trials)]
        assert order == [1e-4, 1e-3, 1e-2, 0.3, 0.1]  # the front first, by err

        metrics = [m for m, _ in goals(study)]
        results = Results(_study(study), [_trial(t, metrics, on_front)
                                          for t in ranked(study, trials)])
        assert results.study.objectives == (("err", "min"), ("speed", "max"))
        assert results.best is None  # no one trial is best
        assert [t.params["lr"] for t in results.pareto_front()] == [1e-4, 1e-3, 1e-2, 0.3]
        assert results[0].values == (0.0, 0.0)
        frame = results.to_dataframe()
        assert list(frame["pareto"]) == [True, True, True, True, False]

        print_results(reader, sid, "json", None, Console())
        data = json.loads(capsys.readouterr().out)
        assert data["objectives"] == OBJECTIVES
        assert [r["pareto"] for r in data["trials"]] == [True, True, True, True, False]
        assert data["trials"][-1]["values"] == [99.0, 3.0]

        print_results(reader, sid, "table", None, Console(width=120))
        out = capsys.readouterr().out
        assert "objectives err (min), speed (max); the Pareto front (*) first, 4" in out
        rows = [line for line in out.splitlines() if "mo-1-t" in line]
        assert [line.split()[2] == "*" for line in rows] == [True] * 4 + [False]
        assert "speed" in out.splitlines()[1] + out.splitlines()[2]

        # Into Optuna: the same front as Optuna's own best_trials.
        storage = f"sqlite:///{tmp_path / 'optuna.db'}"
        export_optuna(reader, sid, storage)
        theirs = optuna.load_study(study_name=sid, storage=storage)
        assert theirs.directions == [optuna.study.StudyDirection.MINIMIZE,
                                     optuna.study.StudyDirection.MAXIMIZE]
        assert theirs.metric_names == ["err", "speed"]
        assert sorted(t.user_attrs["hypersack_trial"] for t in theirs.best_trials) == \
            sorted(on_front)
        for t in theirs.trials:
            assert t.values == [t.user_attrs["metrics"]["err"], t.user_attrs["metrics"]["speed"]]


def test_a_trial_that_ends_without_every_objective_stops_the_study(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "h.db")
    c.apply(c.orch.handle(StudySubmitted(make_space({"type": "random", "samples": 4}))))
    sid = c.orch.studies()[0].id
    # On the way a report of one of them is fine; at its end the other is missing.
    c.run(lambda lr: {"err": 1.0, "sped": 2.0})
    study = c.orch.study(sid)
    assert study.state == StudyState.FAILED
    failed = [t for t in c.orch.trials(sid) if t.state == TrialState.FAILED]
    assert len(failed) == 1 and "'speed'" in failed[0].reason and "sped" in failed[0].reason
    assert {t.state for t in c.orch.trials(sid)} == {TrialState.FAILED, TrialState.CANCELLED}


def test_a_report_with_none_of_the_objectives_stops_the_study_at_once(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "h.db")
    c.apply(c.orch.handle(StudySubmitted(make_space({"type": "random", "samples": 3}))))
    sid = c.orch.studies()[0].id
    tid, launch = sorted(c.running.items())[0]
    c.orch.handle(TrialProgress(tid, launch.node, 1, {"acc": 0.5}, attempt=launch.attempt))
    assert c.orch.study(sid).state == StudyState.FAILED
    assert "'err', 'speed'" in c.orch.s.trials[tid].reason


def test_allowed_missing_objectives_complete_and_are_told_as_failed(tmp_path: Path) -> None:
    c = Cluster(tmp_path / "h.db")
    c.apply(c.orch.handle(StudySubmitted(make_space(
        {"type": "optuna", "trials": 3, "seed": 1}, allow_missing_objective=True))))
    sid = c.orch.studies()[0].id
    c.run(lambda lr: {"err": lr})
    trials = c.orch.trials(sid)
    assert all(t.state == TrialState.COMPLETED for t in trials)
    assert {s for _, s, _ in c.orch.searches.search(sid).history()} == {"FAIL"}
    assert any("speed" in w for w in c.orch.study(sid).warnings)


def test_every_pair_of_front_members_is_incomparable() -> None:
    points = [[math.sin(i), math.cos(i)] for i in range(40)]
    kept = front(points, [False, False])
    for a, b in itertools.permutations(kept, 2):
        assert not dominates(points[a], points[b])
