"""Adding trials to a study (issue 36, 8: `hypersack extend`, `Client.extend`): an
Optuna search goes on with every trial it was told, a random search draws the next
points of its seeded stream, a manual search takes more; an ended study is active again;
what cannot grow is refused with its reason and changes nothing; a restart keeps it."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import StudyState, TrialState
from hypersack.grid.expand import expand
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    NodeJoined,
    Orchestrator,
    OrchestratorConfig,
    StudyCancelled,
    StudyExtended,
    StudySubmitted,
    TrialFinished,
    TrialsAsked,
)
from hypersack.orchestrator.commands import Command, launched
from hypersack.store import MemoryStore, SqliteStore, Store


def make_space(search: dict[str, Any]) -> Any:
    return parse_space({
        "name": "ext", "models": ["resnet18"], "search": search,
        "hyperparameters": {"batch_size": [64], "lr": {
            "distribution": "loguniform", "low": 1e-4, "high": 1.0}},
        "settings": {"epochs": 1, "policy": "ff",
                     "demand": {"compute_pct": 100, "memory_mib": 1000, "epoch_s": 10}}})


def grid_space() -> Any:
    return parse_space({
        "name": "ext", "models": ["resnet18"],
        "hyperparameters": {"batch_size": [64], "lr": [0.1, 0.01]},
        "settings": {"epochs": 1, "policy": "ff",
                     "demand": {"compute_pct": 100, "memory_mib": 1000, "epoch_s": 10}}})


class Cluster:
    """Finishes every launched trial at once with a loss set by its learning rate."""

    def __init__(self, store: Store | None = None) -> None:
        self.clock = ManualClock(100.0)
        self.store = store or MemoryStore()
        self.orch = Orchestrator(self.store, self.clock, OrchestratorConfig(fusion=False))
        self.running: dict[str, Any] = {}
        self.apply(self.orch.handle(NodeJoined(parse_shorthand("1x2xA100-80GB").nodes[0])))

    def apply(self, commands: list[Command]) -> None:
        for c in launched(commands):
            assert c.trial_id not in self.running
            self.running[c.trial_id] = c

    def drain(self) -> None:
        for _ in range(200):
            if not self.running:
                return
            tid, c = sorted(self.running.items())[0]
            del self.running[tid]
            self.clock.advance(1.0)
            loss = abs(math.log10(float(c.params["lr"])) + 2.5)
            self.apply(self.orch.handle(TrialFinished(tid, c.node, {"loss": loss},
                                                      attempt=c.attempt)))
        raise AssertionError("still running")

    def submit(self, sp: Any) -> str:
        self.apply(self.orch.handle(StudySubmitted(sp)))
        return self.orch.studies()[-1].id


def test_an_ended_optuna_study_goes_on_with_everything_its_sampler_was_told() -> None:
    c = Cluster()
    sid = c.submit(make_space({"type": "optuna", "trials": 4, "seed": 7}))
    c.drain()
    assert c.orch.study(sid).state == StudyState.COMPLETED
    first = {t.id: t.params for t in c.orch.trials(sid)}

    c.apply(c.orch.handle(StudyExtended(sid, 3)))
    assert c.orch.study(sid).state == StudyState.ACTIVE
    c.drain()
    trials = c.orch.trials(sid)
    assert c.orch.study(sid).state == StudyState.COMPLETED
    assert [t.coords for t in trials] == [(i,) for i in range(7)]
    assert all(t.state == TrialState.COMPLETED for t in trials)
    assert {t.id: t.params for t in trials[:4]} == first  # the first four untouched
    # The sampler was told all seven, in order, the first four before the new ones.
    history = c.orch.searches.search(sid).history()
    assert [(n, s) for n, s, _ in history] == [(i, "COMPLETE") for i in range(7)]
    assert c.orch.space(sid).search.trials == 7
    assert c.orch.study(sid).space["search"]["trials"] == 7


def test_a_random_search_draws_the_next_points_of_its_stream() -> None:
    c = Cluster()
    sp = make_space({"type": "random", "samples": 5, "seed": 3})
    sid = c.submit(sp)
    c.drain()
    c.apply(c.orch.handle(StudyExtended(sid, 3)))
    c.drain()
    trials = c.orch.trials(sid)
    # Exactly the points an 8-sample study would have had, the first five unchanged.
    eight = expand(make_space({"type": "random", "samples": 8, "seed": 3}), sid)
    assert [(t.id, t.params) for t in trials] == [(t.id, t.params) for t in eight]
    assert all(t.state == TrialState.COMPLETED for t in trials)


def test_an_active_study_grows_and_a_manual_search_takes_more() -> None:
    c = Cluster()
    sid = c.submit(make_space({"type": "manual", "trials": 1}))
    c.apply(c.orch.handle(TrialsAsked(sid, ({"lr": 0.01, "batch_size": 64},))))
    assert c.orch.book.asks_left(sid) == 0
    c.apply(c.orch.handle(StudyExtended(sid, 2)))  # still running its first
    assert c.orch.study(sid).state == StudyState.ACTIVE
    assert c.orch.book.asks_left(sid) == 2
    c.apply(c.orch.handle(TrialsAsked(sid, ({"lr": 0.1, "batch_size": 64},
                                            {"lr": 0.001, "batch_size": 64}))))
    c.drain()
    assert len(c.orch.trials(sid)) == 3
    assert c.orch.study(sid).state == StudyState.COMPLETED


@pytest.mark.parametrize("case", ["grid", "cancelled", "zero", "negative", "huge", "cap",
                                  "unknown"])
def test_what_cannot_grow_is_refused_and_changes_nothing(case: str) -> None:
    c = Cluster()
    sid = c.submit(grid_space() if case == "grid" else
                   make_space({"type": "random", "samples": 2, "seed": 1}))
    if case == "cancelled":
        c.apply(c.orch.handle(StudyCancelled(sid)))
        c.running.clear()
    trials, study = c.orch.trials(sid), c.orch.study(sid)
    n = {"zero": 0, "negative": -5, "huge": 10**9, "cap": 99_999}.get(case, 1)
    result = c.orch.handle_batch([StudyExtended("nope" if case == "unknown" else sid, n)])
    assert len(result.refused) == 1
    reason = str(result.refused[0][1])
    expected = {"grid": "is a grid", "cancelled": "was cancelled", "zero": "extend by 1",
                "negative": "extend by 1", "huge": "extend by 1", "cap": "max_trials",
                "unknown": "no study"}[case]
    assert expected in reason, reason
    assert c.orch.trials(sid) == trials and c.orch.study(sid) == study
    assert c.orch.space(sid).size() == 2


def test_an_extension_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "h.db"
    c = Cluster(SqliteStore(db))
    sid = c.submit(make_space({"type": "optuna", "trials": 2, "seed": 1}))
    c.drain()
    c.apply(c.orch.handle(StudyExtended(sid, 2)))
    before = c.orch.trials(sid)
    c.store.close()
    orch2 = Orchestrator(SqliteStore(db), ManualClock(c.clock.now()),
                         OrchestratorConfig(fusion=False))
    assert orch2.study(sid).state == StudyState.ACTIVE
    assert orch2.space(sid).search.trials == 4
    assert orch2.trials(sid) == before
    assert orch2.book.asks_left(sid) == 4 - len(before)


@pytest.mark.parametrize("given", ["0", "-1", "99999999999", "1e3", "many"])
def test_the_cli_and_the_api_refuse_a_count_out_of_range(
        given: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Refused before anything is sent (a count past int32 once ended in a traceback)."""
    import hypersack
    from hypersack.cli.main import main
    from hypersack.core.errors import InvalidInput

    with pytest.raises(SystemExit) as exit_:
        main(["extend", "s-1", "--trials", given, "--server", "127.0.0.1:1"])
    assert exit_.value.code == 2
    assert "--trials" in capsys.readouterr().err
    with pytest.raises(InvalidInput, match="extend by 1 to"):
        hypersack.Client("127.0.0.1:1").extend("s-1", int(given) if given.lstrip("-").isdigit()
                                                else 10**12)
