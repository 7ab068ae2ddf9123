"""Adaptive search and early stopping in the orchestrator: Optuna's samplers asked as
capacity frees, ASHA / Hyperband / median pruning, paused trials resumed from their
checkpoint, and all of it rebuilt after a restart."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import InvalidInput
from hypersack.core.types import StudyState, TrialRecord, TrialState
from hypersack.grid import rungs
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    KillTrial,
    LaunchGroup,
    LaunchTrial,
    NodeJoined,
    Orchestrator,
    OrchestratorConfig,
    StudySubmitted,
    Tick,
    TrialFinished,
    TrialProgress,
    Wake,
)
from hypersack.orchestrator.commands import Command, DropCheckpoint, launched
from hypersack.store import MemoryStore, SqliteStore, Store

LRS = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 0.0003, 0.0001]


def loss(params: dict[str, Any], epoch: int) -> float:
    """Falls each epoch towards a floor set by the learning rate (best near 0.003): the
    ranking at every rung is the ranking at the end, as the pruner hopes."""
    return (math.log10(float(params["lr"])) + 2.5) ** 2 / 4 + 1.0 / (epoch + 1)


def space(search: dict[str, Any] | None = None, pruner: dict[str, Any] | None = None,
          epochs: float = 9, lrs: list[float] | None = None, command: bool = False,
          **hyper: Any) -> Any:
    data: dict[str, Any] = {
        "name": "ad", "models": ["resnet18"],
        "hyperparameters": {"batch_size": [64], "lr": lrs or LRS, **hyper},
        "settings": {"epochs": epochs, "policy": "ff",
                     "demand": {"compute_pct": 100, "memory_mib": 1000, "epoch_s": 10}},
    }
    if search is not None:
        data["search"] = search
    if pruner is not None:
        data["pruner"] = pruner
    if command:
        data["program"] = {"command": "{python} train.py --lr {lr}"}
        data["models"] = []
        data["hyperparameters"].pop("batch_size")
    return parse_space(data)


@dataclass
class Run:
    launch: LaunchTrial
    epoch: int


@dataclass
class Driver:
    """Runs launched trials epoch by epoch, all in step: each reports the loss above at
    every epoch, stops at its `stop_at` epoch (a pause) or its last (the end), and is
    gone when killed. Keeps every launch, to check no trial ever ran twice at once."""

    orch: Orchestrator
    clock: ManualClock
    running: dict[str, Run] = field(default_factory=dict)
    launches: list[LaunchTrial] = field(default_factory=list)
    kills: list[KillTrial] = field(default_factory=list)
    drops: list[DropCheckpoint] = field(default_factory=list)
    groups: list[LaunchGroup] = field(default_factory=list)
    most_running: int = 0

    def apply(self, commands: list[Command]) -> None:
        for c in launched(commands):
            assert c.trial_id not in self.running, f"{c.trial_id} launched twice at once"
            self.running[c.trial_id] = Run(c, int(c.done_epochs))
            self.launches.append(c)
        for c in commands:
            if isinstance(c, KillTrial):
                self.kills.append(c)
                self.running.pop(c.trial_id, None)
            elif isinstance(c, DropCheckpoint):
                self.drops.append(c)
            elif isinstance(c, LaunchGroup):
                self.groups.append(c)
        self.most_running = max(self.most_running, len(self.running))

    def step(self) -> None:
        """One epoch of every running trial."""
        # The orchestrator's count of pending trials per workload group stays exact.
        for sid, counts in self.orch.s.pending_groups.items():
            assert sum(counts.values()) == len(self.orch.book.pending_of(sid))
        self.clock.advance(10.0)
        for tid in sorted(self.running):
            run = self.running.get(tid)
            if run is None:
                continue  # killed by an earlier trial's report in this step
            run.epoch += 1
            value = loss(run.launch.params, run.epoch)
            metrics = {"loss": value, "epoch": float(run.epoch)}
            self.apply(self.orch.handle(TrialProgress(tid, run.launch.node, run.epoch,
                                                      metrics, attempt=run.launch.attempt)))
            if tid not in self.running:
                continue
            end = run.launch.stop_at or run.launch.epochs
            if run.epoch >= end:
                del self.running[tid]
                self.apply(self.orch.handle(TrialFinished(tid, run.launch.node, metrics,
                                                          attempt=run.launch.attempt)))

    def until_idle(self, limit: int = 1000) -> None:
        for _ in range(limit):
            wake = self.orch.wake_at()
            if wake is not None and (not self.running or wake <= self.clock.now()):
                # Held promotions resume when their window has passed.
                self.clock.set(max(wake, self.clock.now()))
                self.apply(self.orch.handle(Wake()))
                continue
            if not self.running:
                return
            self.step()
        raise AssertionError("still running")


def start(sp: Any, store: Store | None = None, gpus: str = "1x3xA100-80GB",
          fusion: bool = False, ask_budget_s: float | None = None
          ) -> tuple[Orchestrator, Driver, str]:
    """No time bound on asking by default: the tests do not depend on the machine."""
    store = store or MemoryStore()
    clock = ManualClock(100.0)
    orch = Orchestrator(store, clock, OrchestratorConfig(fusion=fusion,
                                                         ask_budget_s=ask_budget_s))
    driver = Driver(orch, clock)
    driver.apply(orch.handle(NodeJoined(parse_shorthand(gpus).nodes[0])))
    driver.apply(orch.handle(StudySubmitted(sp)))
    return orch, driver, orch.studies()[-1].id


def by_state(orch: Orchestrator, sid: str) -> dict[TrialState, list[TrialRecord]]:
    out: dict[TrialState, list[TrialRecord]] = {}
    for t in orch.trials(sid):
        out.setdefault(t.state, []).append(t)
    return out


# ----------------------------------------------------------------- rungs, pure
def test_rungs_and_brackets() -> None:
    sp = space(pruner={"type": "asha", "min_epochs": 1, "reduction_factor": 3}, epochs=27)
    assert rungs.first_rungs(sp.pruner, 27) == (1, 3, 9)
    hb = space(pruner={"type": "hyperband", "min_epochs": 1, "reduction_factor": 3},
               epochs=27).pruner
    assert rungs.brackets(hb, 27) == 4
    assert [rungs.rungs(hb, 27, b) for b in range(4)] == [(1, 3, 9), (3, 9), (9,), ()]
    assert [rungs.bracket_of(hb, 27, i) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    med = space(pruner={"type": "median", "min_epochs": 2}, epochs=5).pruner
    assert rungs.first_rungs(med, 5) == (2, 3, 4)
    assert rungs.next_rung((1, 3, 9), 0) == 1 and rungs.next_rung((1, 3, 9), 3) == 9
    assert rungs.next_rung((1, 3, 9), 9) is None


def test_rung_rules() -> None:
    # Stop mode goes on with the best max(1, n // eta) of the values recorded so far.
    assert rungs.keeps(0.5, [0.5], 3, minimize=True)
    assert rungs.keeps(0.1, [0.3, 0.2, 0.1], 3, minimize=True)
    assert not rungs.keeps(0.2, [0.3, 0.2, 0.1], 3, minimize=True)
    assert rungs.keeps(0.9, [0.9, 0.1, 0.2], 3, minimize=False)
    # Pause mode: at most total // eta^k ever reach rung k, and n // eta of those go on.
    assert rungs.most_ranked(27, 3, 2) == 3
    assert not rungs.never_promoted(2, 27, 3, 0)  # 9 of 27 go on from rung 0
    assert rungs.never_promoted(9, 27, 3, 0)
    assert not rungs.never_promoted(0, 2, 3, 0)  # the best of a rung always may
    assert rungs.median_prunes(0.9, [0.1, 0.2, 0.3], 3, minimize=True)
    assert not rungs.median_prunes(0.9, [0.1, 0.2], 3, minimize=True)
    assert not rungs.median_prunes(0.15, [0.1, 0.2, 0.3], 3, minimize=True)
    assert rungs.ranked({"b": 1.0, "a": 1.0, "c": 0.5}, True) == ["c", "a", "b"]


def test_pruner_settings_are_checked() -> None:
    with pytest.raises(InvalidInput, match="min_epochs"):
        space(pruner={"type": "asha", "min_epochs": 9}, epochs=9)
    with pytest.raises(InvalidInput, match="one length"):
        parse_space({"name": "x", "models": ["resnet18"], "pruner": {"type": "asha"},
                     "settings": {"epochs": 9},
                     "hyperparameters": {"batch_size": [64], "epochs": [3, 9]}})
    with pytest.raises(InvalidInput, match="median"):
        space(pruner={"type": "median", "mode": "pause"})
    with pytest.raises(InvalidInput, match="reduction_factor"):
        space(pruner={"type": "asha", "reduction_factor": 1})
    with pytest.raises(InvalidInput, match="needs trials"):
        space(search={"type": "optuna"})
    with pytest.raises(InvalidInput, match="sampler is for optuna"):
        space(search={"type": "random", "samples": 3, "sampler": "gp"})
    with pytest.raises(InvalidInput, match="samplers take seeds"):
        space(search={"type": "optuna", "trials": 3, "seed": 2**40})
    assert space(pruner={"type": "asha"}).pause_mode()
    assert not space(pruner={"type": "asha"}, command=True).pause_mode()
    assert space(pruner={"type": "asha", "mode": "pause"}, command=True).pause_mode()
    assert not space(pruner={"type": "asha", "mode": "stop"}).pause_mode()


# ----------------------------------------------------------------- ASHA, paused trials
def test_asha_pauses_at_rungs_and_resumes_the_promoted_from_their_checkpoint() -> None:
    orch, d, sid = start(space(pruner={"type": "asha", "min_epochs": 1,
                                       "reduction_factor": 3}, epochs=9))
    # The first attempts stop at the first rung, to be ranked there.
    assert {c.stop_at for c in d.launches} == {1.0}
    d.until_idle()
    states = by_state(orch, sid)
    assert orch.study(sid).state == StudyState.COMPLETED
    assert set(states) == {TrialState.COMPLETED, TrialState.PRUNED}
    done = states[TrialState.COMPLETED]
    # The best learning rate (0.003) is the one that trained to the end.
    assert [t.params["lr"] for t in done] == [0.003]
    # 9 trials at rung 1 promote 3 to rung 3, which promotes 1 to the end.
    at = {r: sum(r in t.rungs for t in orch.trials(sid)) for r in (1, 3)}
    assert at == {1: 9, 3: 3}
    # A promoted trial resumes from its checkpoint: its next attempt starts at the
    # rung's epochs and stops at the next rung.
    resumed = [c for c in d.launches if c.done_epochs > 0]
    assert sorted((c.done_epochs, c.stop_at) for c in resumed) == \
        [(1.0, 3.0)] * 3 + [(3.0, 0.0)]
    # Every pruned trial ranked below every trial promoted from its rung.
    for rung in (1, 3):
        went_on = [t.rungs[rung] for t in orch.trials(sid) if any(r > rung for r in t.rungs)
                   or (t.state == TrialState.COMPLETED and rung in t.rungs)]
        stayed = [t.rungs[rung] for t in states[TrialState.PRUNED]
                  if max(t.rungs) == rung]
        assert went_on and max(went_on) < min(stayed)
    # Epochs trained: 9 x 1 + 3 x 2 + 1 x 6 = 21, against 81 without early stopping.
    assert sum(c.stop_at or c.epochs for c in d.launches) - \
        sum(c.done_epochs for c in d.launches) == 21
    assert not d.kills  # paused trials stop by themselves
    # Each pruned trial's checkpoint is dropped, on the node that holds it, once; the
    # completed trial keeps its own (its final weights).
    assert sorted((c.trial_id, c.node) for c in d.drops) == \
        sorted((t.id, t.launched_on) for t in states[TrialState.PRUNED])


def test_a_rungs_trials_fuse_pause_together_and_promotions_fuse_again() -> None:
    """Fusion with a pruner: a group's members are one rung's trials (the same
    checkpoint epoch, the same next rung), so they pause together; the promoted trials of
    a rung, held together by the promotion window, fuse again from their checkpoints."""
    from hypersack.testing.core import WIDE
    store = MemoryStore()
    for p in WIDE:  # resnet18 at batch 64: alone 40 %, four fused 80 % of an A100
        store.put_profile(p)
    sp = parse_space({"name": "fz", "models": ["resnet18"],
                      "hyperparameters": {"batch_size": [64], "lr": LRS},
                      "settings": {"epochs": 9, "policy": "ff", "fusion": "on",
                                   "oversubscription": {"A100": 1.0}},
                      "pruner": {"type": "asha", "min_epochs": 1, "reduction_factor": 3,
                                 "promotion_window_s": 5}})
    orch, d, sid = start(sp, store, gpus="1x1xA100-80GB", fusion=True)
    d.until_idle()
    assert orch.study(sid).state == StudyState.COMPLETED
    assert [t.params["lr"] for t in orch.trials(sid) if t.state == TrialState.COMPLETED] \
        == [0.003]
    for g in d.groups:  # every group is one rung's
        assert len({(m.done_epochs, m.stop_at) for m in g.members}) == 1
    first = [g for g in d.groups if g.members[0].done_epochs == 0]
    assert first and all(m.stop_at == 1 for g in first for m in g.members)
    # Rung 1's promotions resume from their checkpoints in a fused group.
    promoted = [g for g in d.groups if g.members[0].done_epochs == 1]
    assert promoted and {m.stop_at for g in promoted for m in g.members} == {3.0}
    assert all(len(g.members) >= 2 for g in promoted)
    # `fusion: auto` (the default) does not fuse where a pruner ranks trials.
    auto = parse_space({**sp.model_dump(mode="json"),
                        "settings": {**sp.settings.model_dump(mode="json"), "fusion": "auto"}})
    store = MemoryStore()
    for p in WIDE:
        store.put_profile(p)
    _, d, _ = start(auto, store, gpus="1x1xA100-80GB", fusion=True)
    d.until_idle()
    assert not d.groups and d.launches
    assert d.most_running <= 8


def test_promotions_wait_for_their_window_and_resume_together() -> None:
    orch, d, sid = start(space(pruner={"type": "asha", "min_epochs": 1, "reduction_factor": 3,
                                       "promotion_window_s": 25}, epochs=9))
    d.step()  # all nine reach rung 1 at t=110: three promotable, six can never be
    states = [t.state for t in orch.trials(sid)]
    assert states.count(TrialState.PAUSED) == 3 and states.count(TrialState.PRUNED) == 6
    assert orch.wake_at() == 110 + 25
    d.clock.set(120)
    assert launched(orch.handle(Wake())) == []  # the window is still open
    d.clock.set(135)
    resumed = launched(orch.handle(Wake()))
    # The rung's three promotions resume in one decision, each from its checkpoint.
    assert len(resumed) == 3 and {(c.done_epochs, c.stop_at) for c in resumed} == {(1.0, 3.0)}
    assert orch.wake_at() is None
    d.apply(resumed)
    d.until_idle()
    assert orch.study(sid).state == StudyState.COMPLETED
    assert [t.params["lr"] for t in orch.trials(sid) if t.state == TrialState.COMPLETED] == \
        [0.003]


def test_a_pruned_trial_frees_its_capacity_at_once() -> None:
    # Stop mode: a trial that ranks too low at a rung is killed as it reports it, and
    # a waiting trial takes its GPU in the same decision.
    orch, d, sid = start(space(pruner={"type": "asha", "mode": "stop", "min_epochs": 1,
                                       "reduction_factor": 3}, epochs=9), gpus="1x1xA100-80GB")
    d.until_idle()
    pruned = by_state(orch, sid)[TrialState.PRUNED]
    assert pruned and all(t.reason.startswith("pruned at epoch") for t in pruned)
    assert {k.trial_id for k in d.kills} == {t.id for t in pruned}
    assert all(c.stop_at == 0 for c in d.launches)  # nobody pauses in stop mode
    assert orch.study(sid).state == StudyState.COMPLETED
    # Each kill came with the next launch: the freed GPU never waited.
    assert len(d.launches) == 9
    assert sorted(c.trial_id for c in d.drops) == sorted(t.id for t in pruned)


def test_median_pruner_stops_the_worse_half() -> None:
    orch, d, sid = start(space(pruner={"type": "median", "min_epochs": 2, "min_trials": 3},
                               epochs=6), gpus="1x1xA100-80GB")
    d.until_idle()
    states = by_state(orch, sid)
    # The first trials run without enough company to be judged; later worse ones stop.
    assert TrialState.PRUNED in states and TrialState.COMPLETED in states
    best = min(orch.trials(sid), key=lambda t: loss(t.params, 6))
    assert best.state == TrialState.COMPLETED
    for t in states[TrialState.PRUNED]:
        assert max(t.rungs) < 6


def test_hyperband_brackets_rank_apart() -> None:
    orch, d, sid = start(space(pruner={"type": "hyperband", "min_epochs": 1,
                                       "reduction_factor": 3}, epochs=9))
    d.until_idle()
    trials = orch.trials(sid)
    # Three brackets: rungs (1, 3), (3,) and none. The last bracket's trials run whole.
    hb = orch.space(sid).pruner
    assert hb is not None
    last = [t for i, t in enumerate(trials) if rungs.bracket_of(hb, 9, i) == 2]
    assert last and all(t.state == TrialState.COMPLETED and not t.rungs for t in last)
    first = [t for i, t in enumerate(trials) if rungs.bracket_of(hb, 9, i) == 1]
    assert all(set(t.rungs) <= {3} for t in first)
    assert orch.study(sid).state == StudyState.COMPLETED


# ----------------------------------------------------------------- Optuna
@pytest.mark.parametrize("sampler", ["tpe", "gp", "random", "qmc", "cmaes"])
def test_optuna_search_asks_as_capacity_frees_and_is_told_every_end(sampler: str) -> None:
    sp = space(search={"type": "optuna", "sampler": sampler, "trials": 12, "seed": 3},
               lrs=None, epochs=2)
    sp = parse_space({**sp.model_dump(mode="json"), "hyperparameters": {
        "batch_size": [64], "lr": {"distribution": "loguniform", "low": 1e-4, "high": 1.0},
        "layers": {"distribution": "int", "low": 1, "high": 4}}})
    orch, d, sid = start(sp, gpus="1x1xA100-80GB")
    # One GPU that holds three of these trials: three asked now, not twelve.
    assert len(orch.trials(sid)) == 3 and len(d.launches) == 3
    d.until_idle()
    trials = orch.trials(sid)
    assert len(trials) == 12 and all(t.state == TrialState.COMPLETED for t in trials)
    assert [t.coords for t in trials] == [(i,) for i in range(12)]
    assert all(1e-4 <= t.params["lr"] <= 1.0 and 1 <= t.params["layers"] <= 4 for t in trials)
    history = orch.searches.search(sid).history()
    assert [(n, s) for n, s, _ in history] == [(i, "COMPLETE") for i in range(12)]
    assert [v for *_, v in history] == [t.objective for t in trials]
    assert orch.study(sid).state == StudyState.COMPLETED


def test_a_slow_sampler_asks_the_rest_at_the_next_tick() -> None:
    """The sampler's time per decision is bounded (the server's lock is held while it
    asks): at a bound of 0 each decision asks one trial, and each tick one more, until
    the free capacity is spoken for."""
    sp = space(search={"type": "optuna", "sampler": "tpe", "trials": 12, "seed": 3},
               lrs=None, epochs=2)
    sp = parse_space({**sp.model_dump(mode="json"), "hyperparameters": {
        "batch_size": [64], "lr": {"distribution": "loguniform", "low": 1e-4, "high": 1.0}}})
    orch, d, sid = start(sp, gpus="1x1xA100-80GB", ask_budget_s=0.0)
    assert len(orch.trials(sid)) == 1
    d.apply(orch.handle(Tick()))
    assert len(orch.trials(sid)) == 2
    d.apply(orch.handle(Tick()))
    d.apply(orch.handle(Tick()))
    assert len(orch.trials(sid)) == 3  # the GPU holds three: no more asked
    assert len(d.launches) == 3
    d.until_idle()
    assert orch.study(sid).state == StudyState.COMPLETED and len(orch.trials(sid)) == 12


def test_optuna_with_asha_tells_pruned_trials() -> None:
    sp = parse_space({**space(pruner={"type": "asha", "min_epochs": 1, "reduction_factor": 3},
                              epochs=9).model_dump(mode="json"),
                      "search": {"type": "optuna", "trials": 9, "seed": 1},
                      "hyperparameters": {"batch_size": [64], "lr": {
                          "distribution": "loguniform", "low": 1e-4, "high": 1.0}}})
    orch, d, sid = start(sp)
    d.until_idle()
    trials = orch.trials(sid)
    assert len(trials) == 9
    states = {t.state for t in trials}
    assert states == {TrialState.COMPLETED, TrialState.PRUNED}
    told = {n: s for n, s, _ in orch.searches.search(sid).history()}
    assert told == {t.coords[0]: "COMPLETE" if t.state == TrialState.COMPLETED else "PRUNED"
                    for t in trials}


def test_a_sampler_the_server_cannot_run_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real = builtins.__import__

    def no_cmaes(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "cmaes":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_cmaes)
    orch = Orchestrator(MemoryStore(), ManualClock(0.0))
    with pytest.raises(InvalidInput, match="needs cmaes"):
        orch.handle(StudySubmitted(space(search={"type": "optuna", "trials": 3,
                                                 "sampler": "cmaes"})))
    assert orch.studies() == []


def test_optuna_and_asha_survive_a_restart(tmp_path: Path) -> None:
    """The server stops mid-study: a new orchestrator on the same database rebuilds the
    Optuna study from the trial records and finishes the study, with no trial lost or run
    twice, and the sampler's history holding every trial."""
    sp = parse_space({**space(pruner={"type": "asha", "min_epochs": 1, "reduction_factor": 3},
                              epochs=9).model_dump(mode="json"),
                      "search": {"type": "optuna", "trials": 12, "seed": 5},
                      "hyperparameters": {"batch_size": [64], "lr": {
                          "distribution": "loguniform", "low": 1e-4, "high": 1.0}}})
    db = tmp_path / "h.db"
    store = SqliteStore(db)
    orch, d, sid = start(sp, store, gpus="1x1xA100-80GB")
    for _ in range(3):
        d.step()
    before = {t.id: t for t in orch.trials(sid)}
    # Mid-study: trials paused at a rung, pruned, resumed past it; more to ask.
    assert {TrialState.PAUSED, TrialState.PRUNED, TrialState.RUNNING} <= {
        t.state for t in before.values()}
    assert any(t.done_epochs > 0 for t in before.values()) and len(before) < 12
    running = dict(d.running)
    store.close()

    store2 = SqliteStore(db)
    clock = ManualClock(d.clock.now())
    orch2 = Orchestrator(store2, clock, OrchestratorConfig(fusion=False))
    assert {t.id: t for t in orch2.trials(sid)} == before
    d2 = Driver(orch2, clock, running=running, launches=list(d.launches))
    # The node comes back with what it still runs; the server adopts it.
    from hypersack.orchestrator import RunningTrial

    node = parse_shorthand("1x1xA100-80GB").nodes[0]
    d2.apply(orch2.handle(NodeJoined(node, tuple(
        RunningTrial(tid, r.launch.gpu_index, attempt=r.launch.attempt)
        for tid, r in running.items()))))
    d2.until_idle()
    trials = orch2.trials(sid)
    assert len(trials) == 12
    assert all(t.state in (TrialState.COMPLETED, TrialState.PRUNED) for t in trials)
    assert orch2.study(sid).state == StudyState.COMPLETED
    history = orch2.searches.search(sid).history()
    assert [n for n, *_ in history] == list(range(12))
    assert {n: s for n, s, _ in history} == {
        t.coords[0]: "COMPLETE" if t.state == TrialState.COMPLETED else "PRUNED"
        for t in trials}
    # Params asked before the restart are the ones the rebuilt sampler knows.
    assert all(before[t.id].params == t.params for t in trials if t.id in before)
    store2.close()


# ----------------------------------------------------------------- manual (Client.ask)
def test_given_parameters_are_checked_against_the_space() -> None:
    sp = parse_space({"name": "m", "models": ["resnet18", "resnet34"],
                      "search": {"type": "manual", "trials": 4},
                      "hyperparameters": {
                          "batch_size": [64, 128],
                          "lr": {"distribution": "loguniform", "low": 1e-4, "high": 1.0},
                          "layers": {"distribution": "int", "low": 2, "high": 8, "step": 2}}})
    ok = {"model": "resnet34", "batch_size": 128, "lr": 0.01, "layers": 4}
    assert sp.point(ok) == ok
    assert sp.point({**ok, "layers": 6.0})["layers"] == 6
    for bad, why in [({**ok, "lr": 2.0}, "outside"), ({**ok, "lr": "x"}, "not a number"),
                     ({**ok, "lr": float("nan")}, "finite"), ({**ok, "layers": 5}, "step"),
                     ({**ok, "batch_size": 96}, "not one of"), ({**ok, "model": "bert"},
                                                                 "not one of the study"),
                     ({k: v for k, v in ok.items() if k != "lr"}, "missing lr"),
                     ({**ok, "extra": 1}, "unknown extra"), ([1, 2], "mapping"),
                     ({**ok, "layers": True}, "not a number"),
                     ({k: v for k, v in ok.items() if k != "model"}, "not one of the study")]:
        with pytest.raises(InvalidInput, match=why):
            sp.point(bad)


def test_a_manual_search_runs_the_trials_its_owner_gives() -> None:
    from hypersack.orchestrator import TrialsAsked

    sp = space(search={"type": "manual", "trials": 4}, epochs=2)
    orch, d, sid = start(sp)
    assert orch.trials(sid) == [] and orch.study(sid).state == StudyState.ACTIVE
    with pytest.raises(InvalidInput, match="missing batch_size"):
        orch.handle(TrialsAsked(sid, ({"lr": 0.01, "batch_size": 64}, {"lr": 0.1})))
    assert orch.trials(sid) == []  # refused whole: neither was added
    d.apply(orch.handle(TrialsAsked(sid, ({"lr": 0.01, "batch_size": 64},
                                          {"lr": 0.1, "batch_size": 64}))))
    assert [c.params["lr"] for c in d.launches] == [0.01, 0.1]
    d.until_idle()
    assert orch.study(sid).state == StudyState.ACTIVE  # two more to come
    with pytest.raises(InvalidInput, match="takes 2 more"):
        orch.handle(TrialsAsked(sid, tuple({"lr": 0.3, "batch_size": 64} for _ in range(3))))
    d.apply(orch.handle(TrialsAsked(sid, tuple({"lr": lr, "batch_size": 64}
                                               for lr in (0.3, 1.0)))))
    d.until_idle()
    assert orch.study(sid).state == StudyState.COMPLETED
    assert [t.id for t in orch.trials(sid)] == [f"{sid}-t{i:05d}" for i in range(4)]
    other = start(space())[0]
    with pytest.raises(InvalidInput, match="only a study with search type manual"):
        other.handle(TrialsAsked(other.studies()[0].id, ({"lr": 0.01, "batch_size": 64},)))


def test_a_restart_keeps_each_trial_in_its_bracket_and_rankings(tmp_path: Path) -> None:
    sp = space(pruner={"type": "hyperband", "min_epochs": 1, "reduction_factor": 3}, epochs=9)
    store = SqliteStore(tmp_path / "h.db")
    orch, d, sid = start(sp, store)
    d.step()
    before = {t.id: (orch.book.bracket(t), orch.book.ladder(t)) for t in orch.trials(sid)}
    ranks = {k: len(r) for k, r in orch.pruning.rankings_of(sid).items()}
    store.close()
    store2 = SqliteStore(tmp_path / "h.db")
    again = Orchestrator(store2, ManualClock(d.clock.now()), OrchestratorConfig(fusion=False))
    assert {t.id: (again.book.bracket(t), again.book.ladder(t))
            for t in again.trials(sid)} == before
    assert {k: len(r) for k, r in again.pruning.rankings_of(sid).items()} == ranks
    assert {k: r.paused for k, r in again.pruning.rankings_of(sid).items()} == {
        k: r.paused for k, r in orch.pruning.rankings_of(sid).items()}
    store2.close()


class _FailOnce(MemoryStore):
    """A store whose next `add_trials` fails (a full disk as the search asks)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_next = False

    def add_trials(self, trials: Any) -> None:
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        super().add_trials(trials)


def test_an_ask_that_is_undone_leaves_no_phantom_trial_in_the_sampler() -> None:
    sp = parse_space({**space(epochs=2).model_dump(mode="json"),
                      "search": {"type": "optuna", "trials": 8, "seed": 2},
                      "hyperparameters": {"batch_size": [64], "lr": {
                          "distribution": "loguniform", "low": 1e-4, "high": 1.0}}})
    store = _FailOnce()
    orch, d, sid = start(sp, store, gpus="1x1xA100-80GB")
    assert len(orch.trials(sid)) == 3  # as many as fit (the study states its demand)
    store.fail_next = True
    d.step()
    d.step()  # the trials end; the decision after the first asks, and the store fails
    assert store.fail_next is False  # it did fail once
    # The Optuna study was asked inside the undone decision: it was rebuilt from the
    # records for the next decision's ask, so it knows exactly the trials the store has.
    trials = orch.trials(sid)
    assert trials == store.list_trials(sid) and len(trials) > 3
    assert [n for n, *_ in orch.searches.search(sid).history()] == list(range(len(trials)))
    d.until_idle()
    trials = orch.trials(sid)
    assert len(trials) == 8 and trials == store.list_trials(sid)
    assert [(n, s) for n, s, _ in orch.searches.search(sid).history()] == [
        (i, "COMPLETE") for i in range(8)]
    assert orch.study(sid).state == StudyState.COMPLETED


def test_a_program_that_ignores_its_pause_completes_and_is_not_paused() -> None:
    # Pause mode for a command program that never calls should_stop(): it trains on past
    # the rung it was to pause at. It is ranked at each rung as it passes (stop mode's
    # rule) and, reaching its end, completes: nothing trains it again from the rung.
    sp = space(pruner={"type": "asha", "mode": "pause"}, epochs=9, command=True)
    orch, d, sid = start(sp, gpus="1x1xA100-80GB")
    assert {c.stop_at for c in d.launches} == {1.0}
    for c in d.launches:
        d.running[c.trial_id].launch = replace(c, stop_at=0.0)  # it ignores the pause
    d.until_idle()
    trials = orch.trials(sid)
    assert {t.state for t in trials} <= {TrialState.COMPLETED, TrialState.PRUNED}
    first = [t for t in trials if t.id in {c.trial_id for c in d.launches[:3]}]
    assert all(t.launches == 1 for t in first)
    assert any(t.state == TrialState.COMPLETED for t in first)
