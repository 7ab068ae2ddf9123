"""Fusion-aware planning: fusable trials go out as fused groups of the widest measured
width that is worth it and fits, narrower groups and trials alone take the rest; a
member ends alone while its group's memory stays held; the Sampler measures fused widths
one at a time; `hypersack simulate` shows exclusive, packed and packed + fused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hypersack.cli.main import main
from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import Demand, Profile, TrialRecord, TrialState, WorkloadKey
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    LaunchGroup,
    LaunchTrial,
    NodeJoined,
    NodeLost,
    Orchestrator,
    OrchestratorConfig,
    ProfileFailed,
    ProfileMeasured,
    ProfileWorkload,
    RunningTrial,
    StudySubmitted,
    TrialFinished,
    TrialOutOfMemory,
    TrialProgress,
    fusion,
    launched,
)
from hypersack.sim.fused import fused_estimate
from hypersack.store.sqlite import SqliteStore
from hypersack.testing.core import WIDE
from hypersack.testing.core import fused_prof as prof

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
KEY = WorkloadKey(model="resnet18", batch_size=64)


def space(n: int, **settings: Any) -> Any:
    return parse_space({
        "name": "f", "models": ["resnet18"],
        "hyperparameters": {"batch_size": [64], "lr": [0.01 * (i + 1) for i in range(n)]},
        "settings": {"retries": 1, "policy": "ff", "oversubscription": {"A100": 1.0},
                     **settings},
    })


def make(profiles: list[Profile], store: Any = None, **config: Any) -> Orchestrator:
    store = store or SqliteStore(":memory:")
    for p in profiles:
        store.put_profile(p)
    return Orchestrator(store, ManualClock(100.0), OrchestratorConfig(**config))


def groups(cmds: list[Any]) -> list[LaunchGroup]:
    return [c for c in cmds if isinstance(c, LaunchGroup)]


def join(orch: Orchestrator, shorthand: str) -> list[Any]:
    return orch.handle(NodeJoined(parse_shorthand(shorthand).nodes[0]))


# ----------------------------------------------------------------- pure parts
def trial(params: dict[str, Any], key: WorkloadKey = KEY, **kw: Any) -> TrialRecord:
    return TrialRecord(id="s-t1", study_id="s", coords=(0,), params=params, key=key,
                       epochs=1, **kw)


def test_what_fuses_and_what_does_not() -> None:
    a = fusion.class_of(trial({"model": "resnet18", "batch_size": 64, "lr": 0.1, "seed": 3}))
    b = fusion.class_of(trial({"model": "resnet18", "batch_size": 64, "lr": 0.5,
                               "momentum": 0.5, "weight_decay": 1e-4}))
    assert a is not None and a == b  # only fusable hyperparameters differ
    assert fusion.class_of(trial({"lr": 0.1, "dropout": 0.1})) != a  # not fusable: apart
    # Adam and AdamW fuse (betas and epsilon per member), apart from SGD's trials; an
    # optimizer the fused trainer lacks never fuses, also where it is no demand key.
    adam = KEY.model_copy(update={"optimizer": "adam"})
    assert fusion.class_of(trial({"optimizer": "adam", "lr": 0.1, "beta1": 0.8}, adam)) == \
        fusion.class_of(trial({"optimizer": "adam", "lr": 0.2, "beta2": 0.99}, adam)) != a
    assert fusion.class_of(trial({"optimizer": "lamb"})) is None
    # Mixed precision fuses, each precision apart (a scale per member for fp16).
    fp16 = KEY.model_copy(update={"precision": "fp16"})
    assert fusion.class_of(trial({"precision": "fp16"}, fp16)) not in (None, a)
    assert fusion.class_of(trial({"precision": "bf16"})) not in (None, a)
    assert fusion.class_of(trial({"precision": "fp8"})) is None
    assert fusion.class_of(trial({}, WorkloadKey(model="digits_mlp", batch_size=32))) is None
    assert fusion.class_of(trial({}, WorkloadKey(model="cmd-abc", batch_size=0))) is None
    assert fusion.class_of(trial({}, memory_override_mib=5000)) is None  # ran out of memory


def test_widths_chunks_memory_fit_and_shares() -> None:
    assert fusion.candidate_widths(8, 20) == [2, 4, 8]
    assert fusion.candidate_widths(8, 5) == [2, 4] and fusion.candidate_widths(1, 9) == []
    assert [len(c) for c in fusion.chunks(list(range(11)), [2, 4, 8])] == [8, 2, 1]
    assert [len(c) for c in fusion.chunks(list(range(3)), [4])] == [1, 1, 1]
    a, b = fusion.fit_memory([(1, 1000), (2, 1600), (4, 2800)]) or (0, 0)
    assert a == pytest.approx(400) and b == pytest.approx(600)
    assert fusion.fit_memory([(1, 1000)]) is None
    share = fusion.member_share(Demand(compute_pct=95, memory_mib=5201, cores=1), 8)
    assert share.memory_mib * 8 >= 5201 and share.compute_pct == pytest.approx(95 / 8)
    # Cheaper per member than alone: worth it; dearer: not.
    assert fusion.useful(WIDE[0], WIDE[3], 100.0, 81920)
    assert not fusion.useful(WIDE[0], prof(2, 90, 1600, 0.3), 100.0, 81920)


# ----------------------------------------------------------------- decisions
def test_fusable_trials_go_out_as_one_group_of_the_widest_width() -> None:
    orch = make(WIDE)
    join(orch, "1x1xA100-80GB")
    cmds = orch.handle(StudySubmitted(space(8)))
    (g,) = groups(cmds)
    assert g.key.fusion_width == 8 and len(g.members) == 8 and g.demand == WIDE[3].demand
    assert not [c for c in cmds if isinstance(c, LaunchTrial)]  # none alone
    trials = orch.trials(orch.studies()[0].id)
    assert {t.group for t in trials} == {g.group_id} and {t.group_width for t in trials} == {8}
    assert all(t.state == TrialState.RUNNING and t.demand is not None
               and t.demand.memory_mib == 650 for t in trials)
    assert orch.gpu_load()["node0", 0][0] == 8


def test_a_fused_group_carries_its_speed_per_architecture() -> None:
    # Profiled on both architectures, every width twice as fast on the H100: the group's
    # placement item says so, as a trial alone's does, so the policies that weigh where
    # an item ends (eft) or gains most see it; before, a group carried only its slowest
    # run time and looked as fast everywhere.
    h100 = [p.model_copy(update={"arch": "H100", "iter_time_s": p.iter_time_s / 2})
            for p in WIDE]
    orch = make(WIDE + h100)
    for node in parse_shorthand("1x1xA100-80GB,1x1xH100-80GB").nodes:
        orch.handle(NodeJoined(node))
    (g,) = groups(orch.handle(StudySubmitted(space(8, policy="eft"))))
    assert g.node == "node1"  # the H100, where the group ends sooner
    (decision,) = [d for d in orch.decisions if d.batch]
    (item,) = decision.batch
    assert item.id.startswith("fused:") and item.speed == pytest.approx(
        {"A100": 1.0, "H100": 2.0})
    assert item.run_time_s == pytest.approx(0.25 * 100)  # the slowest: one epoch on the A100


def test_a_group_too_wide_for_what_is_left_is_cut_narrower() -> None:
    # 4 GB of GPU memory: width 8 (5.2 GB) never fits, width 4 (2.8 GB) once, and the
    # rest go as narrower groups and alone where compute and memory allow.
    orch = make(WIDE)
    join(orch, "1x1xA100-4GB")
    cmds = orch.handle(StudySubmitted(space(8)))
    widths = sorted((len(g.members) for g in groups(cmds)), reverse=True)
    assert widths[0] == 4
    used = sum({4: 2800, 2: 1600}[w] for w in widths)
    alone = [c for c in cmds if isinstance(c, LaunchTrial)]
    assert used + 1000 * len(alone) <= 4096
    assert len(launched(cmds)) == sum(widths) + len(alone) < 8


def test_fusion_off_and_a_width_not_worth_it_pack_trials_alone() -> None:
    orch = make(WIDE)
    join(orch, "1x1xA100-80GB")
    cmds = orch.handle(StudySubmitted(space(2, fusion="off")))
    assert not groups(cmds) and len(launched(cmds)) == 2
    dear = [prof(), prof(2, 90, 1900, 0.25)]  # slower per member than alone
    orch = make(dear)
    join(orch, "1x1xA100-80GB")
    cmds = orch.handle(StudySubmitted(space(2)))
    assert not groups(cmds) and len(launched(cmds)) == 2
    orch = make(WIDE, fusion=False)  # the server-wide switch
    join(orch, "1x1xA100-80GB")
    assert not groups(orch.handle(StudySubmitted(space(4))))


def test_a_member_ends_alone_and_its_memory_stays_with_the_group() -> None:
    orch = make(WIDE)
    join(orch, "1x1xA100-80GB")
    (g,) = groups(orch.handle(StudySubmitted(space(4))))
    held = orch.held("node0", 0)[1]
    assert held >= 2800
    first, *rest = g.members
    # One member diverges: it is killed alone, the others go on.
    cmds = orch.handle(TrialProgress(first.trial_id, "node0", 1, {"loss": float("nan")},
                                     nonfinite=("loss",), attempt=first.attempt))
    assert [c.trial_id for c in cmds if hasattr(c, "reason")] == [first.trial_id]
    assert orch.trial(first.trial_id).state == TrialState.DIVERGED
    assert orch.held("node0", 0)[1] == held  # the process still holds the stacked parameters
    for m in rest[:-1]:
        orch.handle(TrialFinished(m.trial_id, "node0", {"loss": 1.0}, attempt=m.attempt))
    assert orch.held("node0", 0)[1] == held
    orch.handle(TrialFinished(rest[-1].trial_id, "node0", {"loss": 1.0},
                              attempt=rest[-1].attempt))
    assert orch.held("node0", 0) == (0, 0, 0)


def test_a_group_out_of_memory_grows_its_width_once_and_members_run_again() -> None:
    orch = make(WIDE)
    join(orch, "1x1xA100-80GB")
    (g,) = groups(orch.handle(StudySubmitted(space(4, oversubscription={"A100": 3.0}))))
    for m in g.members:
        orch.handle(TrialOutOfMemory(m.trial_id, "node0", attempt=m.attempt))
    wide = next(p for p in orch.profiles() if p.key.fusion_width == 4)
    assert wide.demand.memory_mib == 4200  # 2800 x 1.5, once for the group
    trials = orch.trials(orch.studies()[0].id)
    assert all(t.failures == 0 and t.launches == 2 for t in trials)  # again, no failure


def test_a_lost_node_requeues_members_and_a_restart_keeps_groups(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    orch = make(WIDE, store=SqliteStore(db))
    join(orch, "1x1xA100-80GB")
    (g,) = groups(orch.handle(StudySubmitted(space(4))))
    # A restarted server knows the group: a member's memory still passes to another.
    again = Orchestrator(SqliteStore(db), ManualClock(101.0), OrchestratorConfig())
    again.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0], running=tuple(
        RunningTrial(m.trial_id, 0, attempt=m.attempt) for m in g.members)))
    first = g.members[0]
    again.handle(TrialFinished(first.trial_id, "node0", {"loss": 1.0}, attempt=first.attempt))
    assert again.held("node0", 0)[1] >= 2800
    again.handle(NodeLost("node0"))
    trials = again.trials(again.studies()[0].id)
    assert sorted(t.state.value for t in trials) == ["COMPLETED"] + ["PENDING"] * 3
    assert all(t.group == "" for t in trials if t.state == TrialState.PENDING)


# ----------------------------------------------------------------- profiling widths
def test_fused_widths_are_measured_one_at_a_time_until_one_fails() -> None:
    orch = make([prof()])
    cmds = join(orch, "1x1xA100-80GB") + orch.handle(StudySubmitted(space(8)))
    (p2,) = [c for c in cmds if isinstance(c, ProfileWorkload)]
    assert p2.key.fusion_width == 2 and not launched(cmds)
    cmds = orch.handle(ProfileMeasured(prof(2, 60, 1600, 0.12), "node0"))
    (p4,) = [c for c in cmds if isinstance(c, ProfileWorkload)]
    assert p4.key.fusion_width == 4
    cmds = orch.handle(ProfileFailed(p4.key, "A100", "node0", "out of memory"))
    # Width 4 failed: no wider one is tried, and width 2 places the trials.
    assert not [c for c in cmds if isinstance(c, ProfileWorkload)]
    assert {len(g.members) for g in groups(cmds)} == {2}


def test_a_width_the_memory_fit_says_no_gpu_holds_is_not_measured() -> None:
    # a + b K from widths 1 and 2: 1000 + 30000 (K - 1); width 4 needs ~91 GB.
    orch = make([prof(), prof(2, 60, 31000, 0.12)])
    cmds = join(orch, "1x1xA100-80GB") + orch.handle(StudySubmitted(space(4)))
    assert not [c for c in cmds if isinstance(c, ProfileWorkload)]


# ----------------------------------------------------------------- simulator
def test_simulate_shows_exclusive_packed_and_fused(capsys: Any, tmp_path: Path) -> None:
    svg = tmp_path / "g.svg"
    assert main(["simulate", str(EXAMPLES / "sp3.yaml"), "--cluster", "1x4xA100-80GB@88",
                 "--profiles", str(EXAMPLES / "profiles-estimates.yaml"), "--json",
                 "--gantt", str(svg)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fusion"] and out["fused_groups"] > 0 and out["completed"] == 96
    assert out["baseline_makespan_s"] > out["packed_makespan_s"] > out["makespan_s"]
    assert sum(g["trials"] for g in out["gpus"]) == 96
    assert sum(g["fused_groups"] for g in out["gpus"]) == out["fused_groups"]
    assert 'class="label"' in svg.read_text() and ">x" in svg.read_text()
    assert main(["simulate", str(EXAMPLES / "sp3.yaml"), "--cluster", "1x4xA100-80GB@88",
                 "--profiles", str(EXAMPLES / "profiles-estimates.yaml")]) == 0
    text = capsys.readouterr().out
    assert "one trial per GPU" in text and "packed + fused" in text


def test_the_fused_estimate_has_hftas_shape() -> None:
    single = prof(1, 40, 1500, 0.025).model_copy(update={"data_fraction": 0.3})
    w = [fused_estimate(single, k) for k in (2, 4, 8)]
    mem = [p.demand.memory_mib for p in w]
    assert mem[1] - mem[0] == mem[2] - mem[1] - (mem[2] - mem[1]) // 2  # linear in K
    assert all(p.iter_time_s / p.key.fusion_width < single.iter_time_s for p in w)
    assert [p.demand.compute_pct for p in w] == sorted(p.demand.compute_pct for p in w)
