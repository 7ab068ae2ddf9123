"""Several studies at once: priorities, weighted fair share between users and studies,
quotas, and preemption (the rule in `orchestrator.shares` and docs/sharing.md)."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import PermissionDenied, StaleEvent
from hypersack.core.types import TrialState, UserShare
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    KillTrial,
    LaunchTrial,
    NodeJoined,
    Orchestrator,
    OrchestratorConfig,
    ProfilesImported,
    StudySubmitted,
    Tick,
    TrialFailed,
    TrialFinished,
)
from hypersack.orchestrator.shares import Claim, Quota, targets, water_fill
from hypersack.store import MemoryStore
from hypersack.testing.core import prof, study
from hypersack.testing.server import SLEEP_SPACE, start


def orchestrator(nodes: str = "1x2xA100-80GB", **config: Any
                 ) -> tuple[Orchestrator, ManualClock]:
    store = MemoryStore()
    store.put_profile(prof("resnet18", 64, compute=50.0, memory=1000))
    clock = ManualClock(0.0)
    # Shares count GPU-equivalents at the server's ratios: the same as the studies' here.
    config.setdefault("oversubscription", {"A100": 1.0})
    orch = Orchestrator(store, clock, OrchestratorConfig(**config))
    for node in parse_shorthand(nodes).nodes:
        orch.handle(NodeJoined(node))
    return orch, clock


def running(orch: Orchestrator) -> Counter[str]:
    return Counter(t.study_id for t in orch.trials() if t.state == TrialState.RUNNING)


def finish_one(orch: Orchestrator, clock: ManualClock, study_id: str | None = None
               ) -> list[Any]:
    """The longest-running trial (of that study, or of any) ends: trials of equal length."""
    t = min((t for t in orch.trials(study_id) if t.state == TrialState.RUNNING),
            key=lambda t: (t.started_at, t.id))
    clock.advance(1.0)
    assert t.node is not None
    return orch.handle(TrialFinished(t.id, t.node, attempt=t.launches))


# ------------------------------------------------------------------ the arithmetic
def test_water_fill_splits_by_weight_and_passes_on_what_one_cannot_use() -> None:
    assert water_fill(4.0, [(1, math.inf), (1, math.inf)]) == [2.0, 2.0]
    assert water_fill(4.0, [(3, math.inf), (1, math.inf)]) == [3.0, 1.0]
    # The first can use only 0.5: the other gets the rest.
    assert water_fill(4.0, [(1, 0.5), (1, math.inf)]) == [0.5, 3.5]
    assert water_fill(4.0, [(1, 1.0), (1, 1.0)]) == [1.0, 1.0]  # capacity left over
    assert water_fill(4.0, [(0, math.inf), (1, math.inf)]) == [0.0, 4.0]


def test_targets_split_between_users_first_then_their_studies() -> None:
    claims = [Claim("a1", "alice", 0, 1.0, 1, pending=True),
              Claim("a2", "alice", 0, 1.0, 2, pending=True),
              Claim("b1", "bob", 0, 1.0, 3, pending=True)]
    assert targets(claims, 8.0, lambda u: 1.0) == {"a1": 2.0, "a2": 2.0, "b1": 4.0}
    weights = {"alice": 3.0, "bob": 1.0}
    assert targets(claims, 8.0, weights.__getitem__) == {"a1": 3.0, "a2": 3.0, "b1": 2.0}
    # A study with nothing pending keeps what it holds; the rest goes to the others.
    claims[2] = Claim("b1", "bob", 0, 1.0, 3, used=1.0, pending=False)
    assert targets(claims, 8.0, lambda u: 1.0) == {"a1": 3.5, "a2": 3.5, "b1": 1.0}


def test_a_quota_counts_distinct_gpus_and_compute() -> None:
    q = Quota(compute=1.0, gpus=1, held=set())
    assert q.allows(("n", 0), 0.5)
    q.take(("n", 0), 0.5)
    assert not q.allows(("n", 1), 0.25)  # a second GPU
    assert q.allows(("n", 0), 0.5)
    q.take(("n", 0), 0.5)
    assert not q.allows(("n", 0), 0.01)  # compute spent


# ------------------------------------------------------------------ the orchestrator
def test_the_first_study_takes_the_idle_cluster_and_freed_gpus_go_to_the_second() -> None:
    orch, clock = orchestrator()  # 2 GPUs x 2 trials of 50 % = 4 slots
    orch.handle(StudySubmitted(study("a")))
    assert running(orch) == {"a-1": 4}  # work-conserving: nothing idles
    orch.handle(StudySubmitted(study("b")))
    assert running(orch) == {"a-1": 4}  # nothing is stopped without preempt
    for expect in ({"a-1": 3, "b-1": 1}, {"a-1": 2, "b-1": 2}):
        finish_one(orch, clock, "a-1")
        assert running(orch) == expect
    # At equal shares each exit hands its slot to its own study again.
    for sid in ["a-1", "b-1", "b-1", "a-1", "a-1", "b-1"]:
        finish_one(orch, clock, sid)
        assert running(orch) == {"a-1": 2, "b-1": 2}


def test_a_cycle_with_nothing_pending_weighs_no_shares(monkeypatch: pytest.MonkeyPatch
                                                       ) -> None:
    """With every trial of every study placed, an exit's decision cycle has nothing to
    decide, reserve or preempt: it does not walk the cluster for the studies' standing
    (at a thousand nodes most cycles are such)."""
    orch, clock = orchestrator()
    orch.handle(StudySubmitted(study("a", n=2)))
    orch.handle(StudySubmitted(study("b", n=2, priority=1, preempt=True)))
    assert running(orch) == {"a-1": 2, "b-1": 2}
    weighed: list[int] = []
    claims = orch.decider.claims
    monkeypatch.setattr(orch.decider, "claims",
                        lambda active: weighed.append(len(active)) or claims(active))
    finish_one(orch, clock, "a-1")
    assert weighed == [] and running(orch) == {"a-1": 1, "b-1": 2}
    orch.handle(StudySubmitted(study("c", n=3)))  # one waits: its shares are weighed
    assert weighed and running(orch) == {"a-1": 1, "b-1": 2, "c-1": 1}


def test_weights_set_the_shares_between_studies() -> None:
    orch, clock = orchestrator("1x4xA100-80GB")  # 8 slots
    orch.handle(StudySubmitted(study("a", n=40)))
    orch.handle(StudySubmitted(study("b", n=40, weight=3)))
    for _ in range(12):
        finish_one(orch, clock)
    assert running(orch) == {"a-1": 2, "b-1": 6}


def test_users_share_first_then_their_studies() -> None:
    orch, clock = orchestrator("1x4xA100-80GB",
                               shares={"carol": UserShare(weight=2.0)})
    orch.handle(StudySubmitted(study("a1", n=40), owner="alice"))
    orch.handle(StudySubmitted(study("a2", n=40), owner="alice"))
    orch.handle(StudySubmitted(study("b1", n=40), owner="bob"))
    for _ in range(12):
        finish_one(orch, clock)
    # 8 slots, alice and bob at weight 1: 4 each, alice's split between her studies.
    assert running(orch) == {"a1-1": 2, "a2-1": 2, "b1-1": 4}
    orch.handle(StudySubmitted(study("c1", n=40), owner="carol"))  # weight 2
    for _ in range(16):
        finish_one(orch, clock)
    assert running(orch) == {"a1-1": 1, "a2-1": 1, "b1-1": 2, "c1-1": 4}


def test_a_higher_priority_study_gets_every_freed_gpu_first() -> None:
    orch, clock = orchestrator()
    orch.handle(StudySubmitted(study("low")))
    orch.handle(StudySubmitted(study("high", n=3, priority=5)))
    assert running(orch) == {"low-1": 4}
    for expect in ({"low-1": 3, "high-1": 1}, {"low-1": 2, "high-1": 2},
                   {"low-1": 1, "high-1": 3}, {"low-1": 1, "high-1": 3}):
        finish_one(orch, clock, "low-1")
        assert running(orch) == expect


def test_preempt_stops_lower_priority_trials_and_requeues_them_without_a_failure() -> None:
    orch, clock = orchestrator()
    orch.handle(StudySubmitted(study("bg", priority=-1)))
    before = {t.id: t for t in orch.trials("bg-1") if t.state == TrialState.RUNNING}
    clock.advance(5)
    cmds = orch.handle(StudySubmitted(study("urgent", n=2, preempt=True)))
    kills = [c for c in cmds if isinstance(c, KillTrial)]
    starts = [c for c in cmds if isinstance(c, LaunchTrial)]
    assert len(kills) == 2 and len(starts) == 2
    assert cmds.index(kills[-1]) < cmds.index(starts[0])  # stops before launches
    assert {c.trial_id for c in starts} == {t.id for t in orch.trials("urgent-1")}
    assert running(orch) == {"bg-1": 2, "urgent-1": 2}
    for k in kills:
        t = orch.trial(k.trial_id)
        assert t.state == TrialState.PENDING and t.failures == 0
        assert "preempted by study urgent-1" in t.reason
        # The stopped attempt's exit, when the agent reports it, changes nothing.
        with pytest.raises(StaleEvent):
            orch.handle(TrialFailed(k.trial_id, before[k.trial_id].node or "", -9,
                                    attempt=k.attempt))
        assert orch.trial(k.trial_id).state == TrialState.PENDING
    # No thrash: the next decisions stop nothing more (here: a background trial ends).
    cmds = finish_one(orch, clock, "bg-1")
    assert not [c for c in cmds if isinstance(c, KillTrial)]
    assert running(orch) == {"bg-1": 2, "urgent-1": 2}
    clock.advance(1)
    assert orch.handle(Tick()) == []
    # When the urgent trials end, the stopped ones run again (a new attempt).
    for _ in range(2):
        finish_one(orch, clock, "urgent-1")
    assert running(orch) == {"bg-1": 4}
    assert all(orch.trial(k.trial_id).launches == 2 for k in kills)


def test_preempt_picks_the_gpu_that_needs_the_fewest_stops() -> None:
    """A trial of a whole GPU: the GPU with one background trial gives way (one stop),
    not the one with two; a trial that fits where room is left stops nothing."""
    orch, clock = orchestrator()  # 2 GPUs, ratio 1; resnet18 at batch 64: 50 %
    orch.handle(ProfilesImported((prof("resnet18", 128, compute=100.0, memory=2000),)))
    orch.handle(StudySubmitted(study("bg", n=3, priority=-1)))  # ff: 2 on GPU 0, 1 on 1
    on = Counter(t.gpu_index for t in orch.trials("bg-1") if t.state == TrialState.RUNNING)
    assert on == {0: 2, 1: 1}
    clock.advance(5)
    whole = parse_space({"name": "whole", "models": ["resnet18"],
                         "hyperparameters": {"batch_size": [128], "lr": [0.01]},
                         "settings": {"policy": "ff", "oversubscription": {"A100": 1.0},
                                      "fusion": "off", "priority": 5, "preempt": True}})
    cmds = orch.handle(StudySubmitted(whole))
    kills = [c for c in cmds if isinstance(c, KillTrial)]
    (start,) = [c for c in cmds if isinstance(c, LaunchTrial)]
    assert len(kills) == 1 and start.gpu_index == 1
    assert orch.trial(kills[0].trial_id).gpu_index is None  # requeued
    assert running(orch) == {"bg-1": 2, "whole-1": 1}


def test_preempt_never_stops_equal_or_higher_priority_studies() -> None:
    orch, _ = orchestrator()
    orch.handle(StudySubmitted(study("peer")))
    cmds = orch.handle(StudySubmitted(study("pushy", n=2, preempt=True)))
    assert not [c for c in cmds if isinstance(c, (KillTrial, LaunchTrial))]
    assert running(orch) == {"peer-1": 4}


def test_preempt_stops_a_fused_group_whole() -> None:
    orch, _ = orchestrator("1x1xA100-80GB")
    store_profiles = [prof("resnet18", 64, compute=50.0, memory=1000)]
    from hypersack.orchestrator.fusion import fused_key

    for w in (2, 4, 8):
        p = store_profiles[0]
        wide = p.model_copy(update={
            "key": fused_key(p.key, w),
            "demand": p.demand.model_copy(update={"compute_pct": 80.0,
                                                  "memory_mib": 1000 + 300 * w}),
            "iter_time_s": p.iter_time_s * w * 0.4})
        orch.s.profiles[wide.key, wide.arch] = wide
    orch.handle(StudySubmitted(study("bg", n=4, priority=-1, fusion="auto",
                                     oversubscription={"A100": 1.0})))
    groups = {t.group for t in orch.trials("bg-1") if t.state == TrialState.RUNNING}
    assert len(groups) == 1 and "" not in groups
    cmds = orch.handle(StudySubmitted(study("urgent", n=1, preempt=True)))
    kills = {c.trial_id for c in cmds if isinstance(c, KillTrial)}
    assert kills == {t.id for t in orch.trials("bg-1")}  # all four members
    assert running(orch) == {"urgent-1": 1}
    assert orch.held("node0", 0)[2] == 1


def test_quotas_cap_gpus_and_compute_per_user() -> None:
    orch, clock = orchestrator("1x4xA100-80GB", shares={
        "alice": UserShare(max_gpus=1), "bob": UserShare(max_compute=1.5)})
    orch.handle(StudySubmitted(study("a", n=10), owner="alice"))
    held = {(t.node, t.gpu_index) for t in orch.trials("a-1") if t.state == TrialState.RUNNING}
    assert running(orch) == {"a-1": 2} and len(held) == 1
    orch.handle(StudySubmitted(study("b", n=10), owner="bob"))
    assert running(orch) == {"a-1": 2, "b-1": 3}  # 3 x 0.5 GPU-equivalents
    finish_one(orch, clock, "b-1")
    assert running(orch) == {"a-1": 2, "b-1": 3}
    # The quota is the user's, across their studies.
    orch.handle(StudySubmitted(study("b2", n=10), owner="bob"))
    assert running(orch)["b2-1"] == 0


def test_a_user_asks_for_a_priority_above_theirs_and_is_refused(tmp_path: Path) -> None:
    s = start(tmp_path, shares={"alice": UserShare(max_priority=3)})
    try:
        urgent = SLEEP_SPACE.replace("retries: 1", "retries: 1, priority: 5")
        with s.client("bob") as bob, pytest.raises(PermissionDenied, match="priority 5"):
            bob.submit(urgent, "urgent.yaml")
        with s.client("alice") as alice, pytest.raises(PermissionDenied, match=r"\(3\)"):
            alice.submit(urgent, "urgent.yaml")
        with s.client("alice") as alice:
            assert alice.submit(urgent.replace("priority: 5", "priority: 3"), "ok.yaml")
            # Lower than one's own default is always allowed: a background study.
            assert alice.submit(urgent.replace("priority: 5", "priority: -7"), "bg.yaml")
        with s.client("root") as root:  # an admin may ask for any
            assert root.submit(urgent, "urgent.yaml").owner == "root"
    finally:
        s.server.stop(0)


@pytest.mark.parametrize("seed", range(6))
def test_random_studies_priorities_and_quotas_never_overcommit(seed: int) -> None:
    rng = random.Random(seed)
    orch, clock = orchestrator("2x2xA100-80GB", shares={
        "u1": UserShare(max_gpus=rng.randint(1, 4)),
        "u2": UserShare(max_compute=rng.choice([0.5, 1.5, 3.0]), weight=2.0)})
    users = ["u1", "u2", "u3"]
    for step in range(120):
        clock.advance(1)
        live = [t for t in orch.trials() if t.state == TrialState.RUNNING]
        if step % 10 == 0 or not live:
            orch.handle(StudySubmitted(study(
                f"s{step}", n=rng.randint(1, 8), priority=rng.randint(-2, 2),
                weight=rng.choice([0.5, 1, 4]), preempt=rng.random() < 0.4),
                owner=rng.choice(users)))
        elif live:
            t = rng.choice(live)
            orch.handle(TrialFinished(t.id, t.node or "", attempt=t.launches))
        for node in ("node0", "node1"):
            for g in (0, 1):
                compute, memory, _ = orch.held(node, g)
                assert compute <= 100 * 100 and memory <= 80 * 1024
        run = [t for t in orch.trials() if t.state == TrialState.RUNNING]
        u1_gpus = {(t.node, t.gpu_index) for t in run
                   if orch.study(t.study_id).owner == "u1"}
        u2_held = sum(0.5 for t in run if orch.study(t.study_id).owner == "u2")
        assert len(u1_gpus) <= orch.config.shares["u1"].max_gpus  # type: ignore[operator]
        assert u2_held <= orch.config.shares["u2"].max_compute + 1e-9  # type: ignore[operator]


def test_shares_come_from_the_server_settings_and_bad_ones_are_refused(tmp_path: Path
                                                                        ) -> None:
    from hypersack.core.errors import InvalidInput
    from hypersack.wire.settings import ServerSettings, load_settings

    good = tmp_path / "server.yaml"
    good.write_text('shares:\n  "*": {weight: 1}\n  alice: {weight: 2, max_gpus: 16, '
                    'max_priority: 10}\n  bob: {max_compute: 4.5}\n')
    s = load_settings(ServerSettings, {}, good)
    assert s.shares["alice"] == UserShare(weight=2, max_gpus=16, max_priority=10)
    config = OrchestratorConfig(shares=s.shares)
    assert config.share_rule("bob").max_compute == 4.5
    assert config.share_rule("carol") == s.shares["*"]
    for bad in ("{alice: {weight: 0}}", "{alice: {weight: .nan}}", "{alice: {max_gpus: -1}}",
                "{'a b': {}}", "{alice: {max_priority: 5000}}", "{alice: {quota: 3}}"):
        path = tmp_path / "bad.yaml"
        path.write_text(f"shares: {bad}\n")
        with pytest.raises(InvalidInput, match="shares"):
            load_settings(ServerSettings, {}, path)


@pytest.mark.parametrize("settings", [{"priority": 1001}, {"priority": 1.5},
                                      {"weight": 0}, {"weight": float("inf")},
                                      {"preempt": "yes"}])
def test_a_study_with_a_bad_priority_weight_or_preempt_is_refused(settings: dict[str, Any]
                                                                  ) -> None:
    from hypersack.core.errors import InvalidInput

    with pytest.raises(InvalidInput, match=next(iter(settings))):
        study("x", **settings)
