"""The server's learned sharing level (orchestrator/learned.py): samples from running
trials' reported iteration times, decisions in small steps, the off switch, a study's
own ratio winning, what a restart keeps, and nothing learned from an undone batch."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import InvalidInput
from hypersack.core.types import TrialState
from hypersack.grid.space import parse_space
from hypersack.orchestrator import NodeJoined, StudySubmitted, TrialFinished, TrialProgress
from hypersack.orchestrator.learned import SETTING
from hypersack.orchestrator.sharing import MOMENTUM
from hypersack.store import MemoryStore
from hypersack.testing.core import launches, make, prof
from hypersack.testing.pools import HeldPool
from hypersack.testing.stores import FailingStore, StoreFailure

SAT, CONTENTION = 150.0, 0.05  # the hidden interference: kernels queue past 150 % load


def slowdown(load_pct: float, n: int) -> float:
    return (1 + CONTENTION * (n - 1)) * max(1.0, load_pct / SAT)


def study(n: int, ratio: float | None = None) -> Any:
    settings: dict[str, Any] = {"policy": "ff", "fusion": "off"}
    if ratio is not None:
        settings["oversubscription"] = {"A100": ratio}
    return parse_space({"name": "s", "models": ["resnet18"],
                        "hyperparameters": {"batch_size": [64],
                                            "lr": [round(1e-4 * (i + 1), 6) for i in range(n)]},
                        "settings": settings})


def learning(store: Any = None, **config: Any) -> Any:
    options = {"learn_ratio": True, "learn_sample_every_s": 1.0, "learn_decide_every_s": 1.0,
               "learn_settle_s": 1.0, "heartbeat_timeout_s": 1e6, **config}
    orch, store, clock = make(store=store, profiles=[prof("resnet18", 64, compute=50.0)],
                              **options)
    return orch, store, clock


def report_round(orch: Any, clock: Any, scale: float = 1.0) -> int:
    """Every running trial reports the iteration time the hidden model gives its GPU."""
    clock.advance(2.0)
    sent = 0
    for (node, idx), (n, _) in orch.gpu_load().items():
        if not n:
            continue
        load = n * 50.0
        for tid in orch.gpu_trials(node, idx):
            orch.handle(TrialProgress(tid, node, 1, {"loss": 1.0},
                                      iter_time_s=0.1 * slowdown(load, n) * scale,
                                      iter_window_s=1.0))
            sent += 1
    return sent


def per_gpu(orch: Any) -> list[int]:
    return [n for (_, _), (n, _) in sorted(orch.gpu_load().items())]


def test_the_ratio_steps_toward_the_hidden_saturation_and_packing_follows() -> None:
    orch, _, clock = learning()
    orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
    # 14 trials at A100's configured ratio 3 (6 of 50 % per GPU): 6, 6, 2, 0.
    orch.handle(StudySubmitted(study(14)))
    assert per_gpu(orch) == [6, 6, 2, 0]
    ratios = [orch.s.config.ratio("A100", {})]
    for _ in range(60):
        report_round(orch, clock)
        ratios.append(orch.s.config.ratio("A100", {}))
    moves = [b - a for a, b in itertools.pairwise(ratios) if b != a]
    # Down from 3 toward 1.5 (the best for this model): a quarter at first, more only as
    # the decisions keep agreeing (sharing.MOMENTUM: a step, a step, two, two, four).
    assert moves and all(m < 0 for m in moves) and moves[:2] == [-0.25, -0.25]
    assert all(-0.25 * min(MOMENTUM, 2 ** (k // 2)) - 1e-9 <= m for k, m in enumerate(moves))
    assert 1.25 <= ratios[-1] <= 2.0
    level = {lv.arch: lv for lv in orch.sharing.levels(["A100"])}["A100"]
    assert level.learning and level.configured == 3.0 and level.ratio == ratios[-1]
    assert level.samples >= 40 and level.moves == len(moves)
    assert abs(level.saturation_pct - SAT) <= 10 and abs(level.contention - CONTENTION) < 0.02
    assert "learned" in level.describe()
    running = sorted(orch.gpu_trials("node0", 0))[0]
    assert level.describe() in orch.explain(running)  # hypersack why
    # New placements follow the learned ratio: GPU 0, emptied, takes ratio x 2 trials.
    orch.handle(StudySubmitted(study(20)))
    for tid in sorted(orch.gpu_trials("node0", 0)):
        orch.handle(TrialFinished(tid, "node0", {"loss": 0.5}))
    assert per_gpu(orch)[0] == int(ratios[-1] * 100 // 50)


@pytest.mark.parametrize("by_workload", [True, False])
def test_each_workload_gets_its_own_fit_and_the_off_switch(by_workload: bool) -> None:
    """Samples carry their trial's model; with samples enough the workload has a fit of
    its own, shown beside the architecture's, and weighed by the trials running (with
    one workload running, the same ratio as the fit of every sample); off: none."""
    ratios = {}
    for on in (True, by_workload):
        orch, _, clock = learning(learn_by_workload=on)
        orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
        orch.handle(StudySubmitted(study(14)))
        for _ in range(60):
            report_round(orch, clock)
        ratios[on] = orch.s.config.ratio("A100", {})
        (level,) = orch.sharing.levels(["A100"])
    assert ratios[True] == ratios[by_workload] < 3.0
    if by_workload:
        (own,) = level.workloads
        assert own.workload == "resnet18" and own.samples >= 40
        assert abs(own.saturation_pct - SAT) <= 10
        assert "; by workload: resnet18 (" in level.describe()
    else:
        assert level.workloads == () and "by workload" not in level.describe()


def test_a_trial_that_reports_often_gets_no_more_than_its_share_of_the_samples() -> None:
    """A trial's program reports its own iteration times. One that reports ten times a
    second (and lies: five times its slowdown) beside three that report every two
    seconds takes at most its share of the GPU's samples, one per learn_sample_every_s
    x the trials there, not every slot it reaches first."""
    orch, _, clock = learning()
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    orch.handle(StudySubmitted(study(4)))
    liar, *honest = sorted(orch.gpu_trials("node0", 0))
    assert len(honest) == 3
    learner = orch.sharing.learner
    honest_s = 0.1 * slowdown(200.0, 4)
    for tick in range(1, 601):  # 60 s, a report from the liar every 0.1 s
        clock.advance(0.1)
        orch.handle(TrialProgress(liar, "node0", 1, iter_time_s=5 * honest_s,
                                  iter_window_s=0.1))
        if tick % 20 == 0:
            for tid in honest:
                orch.handle(TrialProgress(tid, "node0", 1, iter_time_s=honest_s,
                                          iter_window_s=1.0))
    slowdowns = [round(sd, 6) for _, _, sd in learner.samples["A100"]]
    lies = slowdowns.count(round(5 * slowdown(200.0, 4), 6))
    # One sample per 4 s at most for the liar (15 in 60 s, the first one included); the
    # honest trials' reports, every 2 s, take the slots it cannot.
    assert 0 < lies <= 16
    assert len(slowdowns) - lies >= lies


def test_a_gpu_that_changed_during_the_window_gives_no_sample() -> None:
    orch, _, clock = learning()
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    first = launches(orch.handle(StudySubmitted(study(4))))
    learner = orch.sharing.learner
    assert report_round(orch, clock) == 4  # four reports, from one GPU: one sample
    assert len(learner.samples["A100"]) == 1
    orch.handle(TrialFinished(first[0].trial_id, "node0", {"loss": 0.5}))  # the set changes
    clock.advance(0.5)
    for tid in orch.gpu_trials("node0", 0):
        orch.handle(TrialProgress(tid, "node0", 1, iter_time_s=0.2, iter_window_s=1.0))
    assert len(learner.samples["A100"]) == 1
    # Nor a report soon after a change, though its window is short: the trials that came
    # may still be starting (learn_settle_s).
    settled, _, clock2 = learning(learn_settle_s=10.0)
    settled.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    settled.handle(StudySubmitted(study(4)))
    for _ in range(4):  # 2, 4, 6 and 8 s after the launches
        report_round(settled, clock2)
    assert settled.sharing.learner.samples.get("A100") is None
    report_round(settled, clock2)
    assert len(settled.sharing.learner.samples["A100"]) == 1
    # Reports of absurd slowdowns (a broken clock, or a lie) are not samples.
    clock.advance(5)
    for tid in orch.gpu_trials("node0", 0):
        orch.handle(TrialProgress(tid, "node0", 1, iter_time_s=1e4, iter_window_s=1.0))
    assert len(learner.samples["A100"]) == 1


def test_off_switch_and_a_studys_own_ratio_win() -> None:
    orch, store, clock = make(profiles=[prof("resnet18", 64, compute=50.0)],
                              learn_sample_every_s=1.0, learn_decide_every_s=1.0)
    orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
    orch.handle(StudySubmitted(study(14)))
    for _ in range(30):
        report_round(orch, clock)
    assert orch.sharing.learner is None and orch.s.config.ratio("A100", {}) == 3.0
    assert store.get_setting(SETTING) is None
    assert [lv.describe() for lv in orch.sharing.levels(["A100"])] == [
        "A100: ratio 3 (configured; learning is off)"]
    # Learning on, but the study says 3: its GPUs stay packed to 3.
    orch, _, clock = learning()
    orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
    sid = launches(orch.handle(StudySubmitted(study(14, ratio=3.0))))[0].study_id
    for _ in range(30):
        report_round(orch, clock)
    assert orch.s.config.ratio("A100", {}) < 3.0  # the server's moved
    orch.handle(StudySubmitted(study(20, ratio=3.0)))
    for tid in sorted(orch.gpu_trials("node0", 0)):
        orch.handle(TrialFinished(tid, "node0", {"loss": 0.5}))
    assert per_gpu(orch)[0] == 6
    assert orch.counts(sid)[TrialState.COMPLETED] >= 1
    running = sorted(orch.gpu_trials("node0", 0))[0]
    assert "A100: ratio 3 (its study's settings.oversubscription)" in orch.explain(running)


def test_a_restarted_server_keeps_the_ratio_and_samples_and_decides_the_same() -> None:
    store = MemoryStore()
    orch, store, clock = learning(store)
    orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
    orch.handle(StudySubmitted(study(14)))
    for _ in range(40):
        report_round(orch, clock)
    # The state is kept at each decision, and once an interval with new samples: one
    # more sample a while after the last round keeps them all.
    clock.advance(2.0)
    tid = sorted(orch.gpu_trials("node0", 0))[0]
    orch.handle(TrialProgress(tid, "node0", 1, iter_time_s=0.1 * slowdown(300, 6),
                              iter_window_s=1.0))
    moved = orch.s.config.ratio("A100", {})
    assert moved < 3.0
    again, _, _ = learning(store, clock=clock)
    assert again.s.config.ratio("A100", {}) == moved
    assert again.sharing.levels(["A100"]) == orch.sharing.levels(["A100"])
    # The same reports from here: both decide the same.
    for _ in range(15):
        report_round(orch, clock)
        report_round(again, clock, 1.0)
    assert again.s.config.ratio("A100", {}) == orch.s.config.ratio("A100", {})
    # A server configured otherwise for A100 starts A100 afresh from its configuration.
    other, _, _ = learning(store, clock=clock, oversubscription={"A100": 2.0})
    assert other.s.config.ratio("A100", {}) == 2.0
    assert other.sharing.levels(["A100"])[0].samples == 0


def test_an_undone_batch_teaches_nothing_and_a_refused_save_moves_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    failing = FailingStore(MemoryStore())
    orch, _, clock = learning(failing)
    orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
    orch.handle(StudySubmitted(study(14)))
    report_round(orch, clock)
    learner = orch.sharing.learner
    before = {a: len(q) for a, q in learner.samples.items()}
    clock.advance(6.0)  # past each trial's share of its GPU's samples (6 trials x 1 s)
    tid = next(iter(orch.gpu_trials("node0", 0)))
    failing.fail_commits = 1
    with pytest.raises(StoreFailure):
        orch.handle_batch([TrialProgress(tid, "node0", 1, iter_time_s=0.25,
                                         iter_window_s=1.0)])
    assert {a: len(q) for a, q in learner.samples.items()} == before
    # An event of the batch that is undone (here a stale one) takes only its own.
    result = orch.handle_batch([TrialProgress(tid, "node0", 1, iter_time_s=0.25,
                                              iter_window_s=1.0),
                                TrialFinished("s-1-t99999", "node0")])
    assert len(result.stale) == 1
    assert len(learner.samples["A100"]) == before["A100"] + 1
    # The store refuses to keep a move: the ratio in force stays where it was.
    def refuse(key: str, value: str) -> None:
        raise StoreFailure("disk full (injected)")
    monkeypatch.setattr(failing, "put_setting", refuse)
    for _ in range(30):
        report_round(orch, clock)
    assert orch.s.config.ratio("A100", {}) == 3.0 and learner.ratios["A100"] == 3.0
    assert len(learner.samples["A100"]) >= 40


def test_hypersack_nodes_prints_each_architectures_ratio_and_why() -> None:
    from rich.console import Console

    from hypersack._proto.v1 import hypersack_pb2 as pb
    from hypersack.cli.control import print_sharing

    console = Console(record=True, width=300)
    print_sharing([pb.SharingLevel(arch="A100", configured=3, ratio=2.5, learning=True,
                                   samples=120, needed=40, contention=0.05,
                                   saturation_pct=150, moves=2, queued=0.5,
                                   workloads=[pb.WorkloadFit(workload="vit_tiny", samples=60,
                                                             contention=0.1,
                                                             saturation_pct=150),
                                              pb.WorkloadFit(workload="resnet18", samples=50,
                                                             contention=0.02, queued=0.5)]),
                   pb.SharingLevel(arch="H100", configured=2.5, ratio=2.5, learning=True,
                                   samples=7, needed=40)], console)
    assert console.export_text().splitlines() == [
        "A100: ratio 2.5 (learned, 2 moves; configured 3); from 120 samples; each extra "
        "trial costs 5 %, kernels queue past 150 % load for 50 % of an iteration; by "
        "workload: vit_tiny (60 samples: 10 % per extra trial, queues past 150 %), "
        "resnet18 (50 samples: 2 % per extra trial, no saturation seen)",
        "H100: ratio 2.5 (configured); learning: 7 of 40 samples"]


def test_metrics_and_the_wire_carry_each_workloads_fit(tmp_path: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics has a family for the workloads' own fits, and `hypersack nodes` gets them
    over the wire (sharing_messages)."""
    from hypersack.orchestrator.levels import SharingLevel, WorkloadFit
    from hypersack.server.metrics import ServerCollector
    from hypersack.server.service import SchedulerService
    from hypersack.server.views import sharing_messages
    from hypersack.store.sqlite import SqliteStore

    svc = SchedulerService(SqliteStore(tmp_path / "s.db"))
    level = SharingLevel("A100", 3.0, 2.5, True, 120, 40, 0.05, 150.0, 2, 1.0,
                         (WorkloadFit("vit_tiny", 60, 0.1, 150.0, 1.0),))
    monkeypatch.setattr(svc.orch.sharing, "levels", lambda archs=None: [level])
    families = {m.name: m for m in ServerCollector(svc).collect()}
    got = {(s.labels["workload"], s.labels["parameter"]): s.value
           for s in families["hypersack_oversubscription_workload_fit"].samples}
    assert got == {("vit_tiny", "samples"): 60, ("vit_tiny", "contention"): 0.1,
                   ("vit_tiny", "saturation_pct"): 150.0, ("vit_tiny", "queued"): 1.0}
    (msg,) = sharing_messages(svc)
    assert [(w.workload, w.samples, w.saturation_pct) for w in msg.workloads] == \
        [("vit_tiny", 60, 150.0)]


class _Foresight:
    """`ratio_foresight`, faked: what it was asked, and ends best at `best`."""

    def __init__(self, best: float | dict[str, float], fail: bool = False) -> None:
        # One best ratio, or one per study name.
        self.best, self.fail = best, fail
        self.asked: list[dict[str, Any]] = []

    def __call__(self, space: Any, nodes: Any, profiles: Any, config: Any, policy: str,
                 arch: str, candidates: Any, ratios: Any, fits: Any, workload_fits: Any
                 ) -> dict[float, float]:
        self.asked.append({"study": space.name, "nodes": [n.name for n in nodes],
                           "models": sorted({p.key.model for p in profiles}),
                           "policy": policy, "arch": arch, "candidates": list(candidates),
                           "ratios": dict(ratios), "fits": sorted(fits)})
        if self.fail:
            raise RuntimeError("simulator broke")
        if isinstance(self.best, dict):
            best = self.best[space.name]
            return {r: 100.0 + 10.0 * abs(r - best) for r in candidates}
        return {r: 100.0 + 10.0 * abs(r - self.best) for r in candidates}


def test_foresight_steps_the_ratio_toward_the_one_the_busiest_study_ends_first_under(
        caplog: Any) -> None:
    fake = _Foresight(best=2.0)
    orch, _, clock = learning(ratio_foresight=fake)
    orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
    orch.handle(StudySubmitted(study(40)))  # 24 running at ratio 3, 16 pending
    ratios = [orch.s.config.ratio("A100", {})]
    for _ in range(60):
        report_round(orch, clock)
        ratios.append(orch.s.config.ratio("A100", {}))
    moves = [b - a for a, b in itertools.pairwise(ratios) if b != a]
    # The progress model's steps until foresight acts (FORESIGHT_SAMPLES x
    # learn_min_samples samples), then down to 2, where it holds: a quarter, a quarter,
    # a half as the decisions agree (sharing.MOMENTUM), and the quarter left.
    down = moves.index(-0.25)
    assert all(m == 0.25 for m in moves[:down]) and ratios[-1] == 2.0
    assert moves[down:] == [-0.25, -0.25, -0.5, -0.25]
    first = fake.asked[0]
    assert first["study"] == "s" and first["nodes"] == ["node0"] and first["arch"] == "A100"
    assert first["models"] == ["resnet18"] and first["policy"] == "ff"  # the study's rule
    current = first["ratios"]["A100"]  # the ratio in force and a step either side first
    assert first["candidates"][:3] == [current, current - 0.25, current + 0.25]
    assert first["fits"] == ["A100"]
    level = {lv.arch: lv for lv in orch.sharing.levels(["A100"])}["A100"]
    assert re.search(r"; foresight: of \d+ ratios simulated, 2 ends the work at hand "
                     r"soonest \(100 s; 10\d s at the ratio then in force\), target 2$",
                     level.describe()), level.describe()
    # Off: the simulator is never asked, and the progress model sets the target.
    off = _Foresight(best=2.0)
    orch, _, clock = learning(ratio_foresight=off, learn_foresight=False)
    orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
    orch.handle(StudySubmitted(study(40)))
    for _ in range(30):
        report_round(orch, clock)
    assert off.asked == [] and "foresight" not in orch.sharing.levels(["A100"])[0].describe()
    # A simulator that raises leaves the progress model's target (as with none), logged.
    ends = []
    for config in ({"ratio_foresight": _Foresight(best=2.0, fail=True)}, {}):
        orch, _, clock = learning(**config)
        orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
        orch.handle(StudySubmitted(study(40)))
        for _ in range(30):
            report_round(orch, clock)
        ends.append(orch.s.config.ratio("A100", {}))
    assert "A100: simulating study s-1 under candidate ratios failed" in caplog.text
    assert ends[0] == ends[1] != 3.0


def test_a_study_that_arrives_is_foreseen_at_once() -> None:
    # The ratio settles for one study; a larger one arrives. Foresight simulates it at
    # the next batch, with no new samples, and steps toward its best.
    fake = _Foresight(best={"s": 3.0, "big": 1.0})
    orch, _, clock = learning(ratio_foresight=fake, learn_decide_every_s=5.0)
    orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
    orch.handle(StudySubmitted(study(40)))
    for _ in range(30):
        report_round(orch, clock)
    assert orch.s.config.ratio("A100", {}) == 3.0 and fake.asked
    asked = len(fake.asked)
    clock.advance(10.0)
    def space_of(name: str, n: int) -> Any:
        return parse_space({"name": name, "models": ["resnet18"],
                            "hyperparameters": {"batch_size": [64], "lr": [
                                round(1e-5 * (i + 1), 6) for i in range(n)]},
                            "settings": {"policy": "ff", "fusion": "off"}})

    orch.handle(StudySubmitted(space_of("big", 60)))  # 60 pending: the busiest now
    assert orch.s.config.ratio("A100", {}) == 2.75
    assert [a["study"] for a in fake.asked[asked:]] == ["big"]
    assert orch.s.decide_again  # the next tick packs at the new ratio
    # The same study stays the one simulated: no reconsidering at later batches, nor for
    # a study of about as many trials pending (under SUBJECT_SWITCH times as many).
    orch.handle(TrialProgress(min(orch.gpu_trials("node0", 0)), "node0", 1, {"loss": 1.0}))
    clock.advance(10.0)
    orch.handle(StudySubmitted(space_of("alike", 70)))
    assert len(fake.asked) == asked + 1
    waiting = {orch.s.spaces[sid].name: len(w) for sid, w in orch.s.waiting.items() if w}
    assert waiting["alike"] > waiting["big"]


def test_a_study_of_workloads_new_to_the_learner_starts_at_the_configured_ratio() -> None:
    """What was learned holds for the workloads it was learned from: a study mostly of
    others (larger than what waits) is placed at the configured ratio from its first
    decision, and its own samples move the ratio from there. A study of known workloads
    keeps the learned ratio."""
    orch, store, clock = make(profiles=[prof("resnet18", 64, compute=50.0),
                                        prof("mobilenet_v2", 64, compute=50.0)],
                              learn_ratio=True, learn_sample_every_s=1.0,
                              learn_decide_every_s=1.0, learn_settle_s=1.0,
                              heartbeat_timeout_s=1e6)
    orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
    orch.handle(StudySubmitted(study(14)))
    for _ in range(60):
        report_round(orch, clock)
    learned = orch.s.config.ratio("A100", {})
    assert learned <= 2.0
    for node, idx in list(orch.gpu_load()):
        for tid in sorted(orch.gpu_trials(node, idx)):
            orch.handle(TrialFinished(tid, node, {"loss": 0.5}))
    assert sum(per_gpu(orch)) == 0

    def space_of(name: str, model: str, n: int) -> Any:
        return parse_space({"name": name, "models": [model],
                            "hyperparameters": {"batch_size": [64], "lr": [
                                round(1e-5 * (i + 1), 6) for i in range(n)]},
                            "settings": {"policy": "ff", "fusion": "off"}})

    # A submission that is refused resets nothing (a command program of a workload in
    # another user's namespace, all new to the learner).
    with pytest.raises(InvalidInput, match="this study's owner is 'mallory'"):
        orch.handle(StudySubmitted(parse_space({
            "name": "x", "hyperparameters": {"lr": [0.1, 0.2]}, "workload": "bob:net",
            "program": {"command": "{python} t.py --lr {lr}"}}), owner="mallory"))
    assert orch.s.config.ratio("A100", {}) == learned
    # Known workload: the learned ratio packs it (2 trials of 50 % per GPU at <= 2).
    orch.handle(StudySubmitted(space_of("known", "resnet18", 8)))
    assert orch.s.config.ratio("A100", {}) == learned
    assert max(per_gpu(orch)) == int(learned * 100 // 50)
    for node, idx in list(orch.gpu_load()):
        for tid in sorted(orch.gpu_trials(node, idx)):
            orch.handle(TrialFinished(tid, node, {"loss": 0.5}))
    # A small study of a new workload beside a busier cluster's work changes nothing.
    orch.handle(StudySubmitted(space_of("busy", "resnet18", 8)))
    orch.handle(StudySubmitted(space_of("small", "mobilenet_v2", 4)))
    assert orch.s.config.ratio("A100", {}) == learned
    for node, idx in list(orch.gpu_load()):
        for tid in sorted(orch.gpu_trials(node, idx)):
            orch.handle(TrialFinished(tid, node, {"loss": 0.5}))
    # A study of a new workload that sets its own A100 ratio leaves the others' alone.
    own = space_of("own", "mobilenet_v2", 8).model_dump(mode="json")
    own["settings"]["oversubscription"] = {"A100": 1.0}
    orch.handle(StudySubmitted(parse_space(own)))
    assert orch.s.config.ratio("A100", {}) == learned
    assert per_gpu(orch) == [2, 2, 2, 2]  # 50 % each at its own ratio 1
    for node, idx in list(orch.gpu_load()):
        for tid in sorted(orch.gpu_trials(node, idx)):
            orch.handle(TrialFinished(tid, node, {"loss": 0.5}))
    # A new workload: the configured 3 from the first placement (6 per GPU), stored.
    orch.handle(StudySubmitted(space_of("new", "mobilenet_v2", 14)))
    assert orch.s.config.ratio("A100", {}) == 3.0
    assert per_gpu(orch) == [6, 6, 2, 0]
    (level,) = orch.sharing.levels(["A100"])
    assert level.ratio == 3.0 and level.configured == 3.0
    saved = store.get_setting(SETTING)
    assert saved is not None and '"A100": 3.0' in saved


def _handed_off() -> tuple[_Foresight, HeldPool, Any, Any]:
    """A learner whose simulations go to a pool that answers when the test says, run
    until it handed its first simulation there."""
    fake, pool = _Foresight(best=2.0), HeldPool()
    orch, _, clock = learning(ratio_foresight=fake, foresight_pool=pool,
                              foresight_wait_s=0.0)
    orch.handle(NodeJoined(parse_shorthand("1x4xA100-80GB").nodes[0]))
    orch.handle(StudySubmitted(study(40)))
    for _ in range(60):
        report_round(orch, clock)
        if pool.simulations:
            break
    return fake, pool, orch, clock


def test_with_a_pool_a_decision_holds_until_its_simulation_is_in() -> None:
    """The server simulates elsewhere (OrchestratorConfig.foresight_pool): the event
    worker does not wait for the candidate ratios' simulations; the learner's decision
    holds (no step by the progress model meanwhile) and is taken once they are in."""
    fake, pool, orch, clock = _handed_off()
    assert len(pool.simulations) == 1 and fake.asked == []  # handed off, not run here
    held = orch.s.config.ratio("A100", {})
    for _ in range(10):  # samples keep coming; nothing moves, nothing more is handed off
        report_round(orch, clock)
    assert orch.s.config.ratio("A100", {}) == held and len(pool.simulations) == 1
    pool.finish()
    assert len(fake.asked) == 1
    report_round(orch, clock)  # the next batch takes the held decision
    assert orch.s.config.ratio("A100", {}) == held - 0.25
    assert orch.s.decide_again
    level = orch.sharing.levels(["A100"])[0].describe()
    assert "foresight: of" in level and "2 ends the work at hand soonest" in level
    # A simulation that fails in the pool leaves the progress model's target.
    _, pool2, orch, clock = _handed_off()
    pool2.simulations[0][0].set_exception(RuntimeError("the simulation process ended"))
    report_round(orch, clock)
    assert "foresight" not in orch.sharing.levels(["A100"])[0].describe()


def test_a_learner_whose_simulation_never_answers_decides_without_it(caplog: Any) -> None:
    from hypersack.orchestrator.learned import WEIGH_GIVE_UP_S

    fake, pool, orch, clock = _handed_off()
    decided = dict(orch.sharing._decided)
    for _ in range(int(WEIGH_GIVE_UP_S / 2) + 5):  # two seconds a round
        report_round(orch, clock)
    # Decided again past the give-up (the progress model's target), and nothing more
    # queued behind the stuck call.
    assert orch.sharing._decided["A100"] > decided["A100"] + WEIGH_GIVE_UP_S - 5
    assert "no answer from the simulation process" in caplog.text
    assert len(pool.simulations) == 1 and fake.asked == []
