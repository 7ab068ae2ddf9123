from __future__ import annotations

from typing import Any

import pytest

from hypersack.core.errors import StaleEvent
from hypersack.core.types import TrialState
from hypersack.grid.expand import expand
from hypersack.grid.trial import check_transition
from hypersack.grid.view import GridView


def test_view_has_one_axis_per_hyperparameter_and_each_points_state(sp1: Any) -> None:
    trials = expand(sp1, "sp1-1")
    trials[5] = trials[5].model_copy(update={"state": TrialState.COMPLETED})
    view = GridView.of(sp1, trials)
    assert [name for name, _ in view.axes] == ["model", "batch_size", "lr"]
    assert view.shape == (6, 4, 4)
    p = trials[5].params
    assert view.state_at(model=p["model"], batch_size=p["batch_size"], lr=p["lr"]) \
        == TrialState.COMPLETED
    assert view.counts()[TrialState.PENDING] == 95
    assert view.counts(model=p["model"])[TrialState.COMPLETED] == 1
    assert view.counts(model="resnet34")[TrialState.COMPLETED] == 0
    matrix = view.matrix("model", "batch_size")
    assert len(matrix) == 6 and len(matrix[0]) == 4
    assert sum(c[TrialState.COMPLETED] for row in matrix for c in row) == 1
    with pytest.raises(KeyError):
        view.counts(momentum=0.9)


def test_transitions_follow_the_table() -> None:
    check_transition("t", TrialState.RUNNING, TrialState.PENDING)  # retry / lost node
    check_transition("t", TrialState.PENDING, TrialState.PROFILING)
    for done in (TrialState.COMPLETED, TrialState.FAILED, TrialState.CANCELLED):
        with pytest.raises(StaleEvent, match="no transition"):
            check_transition("t", done, TrialState.RUNNING)
    with pytest.raises(StaleEvent):
        check_transition("t", TrialState.PROFILING, TrialState.COMPLETED)
