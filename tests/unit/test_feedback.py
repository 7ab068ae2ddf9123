"""Sampler feedback: observed peaks of running trials correct the history."""

from __future__ import annotations

from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import TrialState, WorkloadKey
from hypersack.orchestrator import (
    Heartbeat,
    NodeJoined,
    ProfilesImported,
    RunningTrial,
    StudySubmitted,
    TrialFinished,
    TrialOutOfMemory,
)
from hypersack.testing.core import launches, make, prof, space

KEY = WorkloadKey(model="resnet18", batch_size=64)


def test_a_trial_using_more_memory_than_profiled_raises_the_profile_for_later_ones() -> None:
    orch, store, _ = make(profiles=[prof("resnet18", 64, compute=20, memory=20000)])
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    first = launches(orch.handle(StudySubmitted(space(n_lr=6))))
    assert len(first) == 4 and first[0].demand.memory_mib == 20000  # 4 x 20 GB in 80 GB
    a, b = first[0].trial_id, first[1].trial_id
    orch.handle(Heartbeat("node0", (RunningTrial(a, 0, 19000, 15.0),)))
    p = store.get_profile(KEY, "A100")
    assert p is not None and p.observed_memory_mib == 19000 and p.observed_compute_pct == 15
    assert p.demand.memory_mib == 20000 and not p.corrected  # below the profile: no change
    orch.handle(Heartbeat("node0", (RunningTrial(a, 0, 26000, 18.0),
                                    RunningTrial(b, 0, 0, 0.0))))
    p = store.get_profile(KEY, "A100")
    assert p is not None and p.demand.memory_mib == 27300  # 26,000 MiB + 5 %
    assert p.corrected == f"memory 20000 -> 27300 MiB (trial {a} used 26000 MiB)"
    assert p.observed_trials == 0
    # Later placements use the corrected demand: after two finish, one more fits in
    # 80 GB (two still run at 20 GB each, 40 GB free > 27.3 GB), not two.
    orch.handle(TrialFinished(a, "node0"))
    nxt = launches(orch.handle(TrialFinished(b, "node0")))
    assert [c.demand.memory_mib for c in nxt] == [27300]
    p = store.get_profile(KEY, "A100")
    assert p is not None and p.observed_trials == 1  # a reported; b never did


def test_utilization_above_the_profile_by_more_than_the_tolerance_raises_compute() -> None:
    orch, store, _ = make(profiles=[prof("resnet18", 64, compute=40, memory=1000)])
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    tid = launches(orch.handle(StudySubmitted(space(n_lr=1))))[0].trial_id
    orch.handle(Heartbeat("node0", (RunningTrial(tid, 0, 500, 48.0),)))  # within 25 %
    p = store.get_profile(KEY, "A100")
    assert p is not None and p.demand.compute_pct == 40 and p.observed_compute_pct == 48
    orch.handle(Heartbeat("node0", (RunningTrial(tid, 0, 500, 61.0),)))
    p = store.get_profile(KEY, "A100")
    assert p is not None and p.demand.compute_pct == 61 and "compute 40 -> 61 %" in p.corrected


def test_out_of_memory_raises_the_history_not_only_the_trial() -> None:
    orch, store, _ = make(profiles=[prof("resnet18", 64, memory=30000)])
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    tid = launches(orch.handle(StudySubmitted(space(n_lr=1))))[0].trial_id
    orch.handle(TrialOutOfMemory(tid, "node0", observed_memory_mib=31000))
    p = store.get_profile(KEY, "A100")
    assert p is not None and p.demand.memory_mib == 45000
    assert p.corrected == f"memory 30000 -> 45000 MiB (trial {tid} ran out of memory at 30000 MiB)"
    # A new study of the same workload asks for 45 GB from its first launch.
    orch.handle(TrialFinished(tid, "node0"))
    fresh = launches(orch.handle(StudySubmitted(space(n_lr=1))))
    assert [c.demand.memory_mib for c in fresh] == [45000]


def test_observations_of_trials_not_running_there_are_ignored() -> None:
    orch, store, _ = make(profiles=[prof("resnet18", 64, memory=1000)])
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0].model_copy(
        update={"name": "other"})))
    tid = launches(orch.handle(StudySubmitted(space(n_lr=1))))[0].trial_id
    node = store.get_trial(tid).node
    stranger = "other" if node == "node0" else "node0"
    orch.handle(Heartbeat(stranger, (RunningTrial(tid, 0, 99999, 99.0),)))
    p = store.get_profile(KEY, "A100")
    assert p is not None and p.demand.memory_mib == 1000 and p.observed_memory_mib == 0
    assert store.get_trial(tid).state == TrialState.RUNNING


def test_import_keeps_known_profiles_unless_told_to_replace() -> None:
    orch, store, _ = make(profiles=[prof("resnet18", 64, memory=1000)])
    orch.handle(ProfilesImported((prof("resnet18", 64, memory=5000),
                                  prof("resnet34", 64, memory=7000))))
    assert store.get_profile(KEY, "A100").demand.memory_mib == 1000  # type: ignore[union-attr]
    other = store.get_profile(WorkloadKey(model="resnet34", batch_size=64), "A100")
    assert other is not None and other.demand.memory_mib == 7000
    orch.handle(ProfilesImported((prof("resnet18", 64, memory=5000),), replace=True))
    assert store.get_profile(KEY, "A100").demand.memory_mib == 5000  # type: ignore[union-attr]
