"""Profile planning, feedback and retry decisions: the pure parts the orchestrator uses."""

from __future__ import annotations

import pytest

from hypersack.core.types import Demand, Profile, WorkloadKey
from hypersack.orchestrator.retries import after_failure, after_out_of_memory
from hypersack.sampler.feedback import corrected
from hypersack.sampler.planning import GpuSlot, missing, plan_profiles, status

A = WorkloadKey(model="resnet18", batch_size=64)
B = WorkloadKey(model="resnet18", batch_size=128)


def test_status_and_missing() -> None:
    profiles = {(A, "A100")}
    failed = {(B, "A100"), (B, "H100")}
    assert status(A, ["A100", "H100"], profiles, failed) == "known"
    assert status(B, ["A100", "H100"], profiles, failed) == "failed"
    assert status(B, ["A100", "H100", "V100"], profiles, failed) == "waiting"
    assert status(A, [], profiles, failed) == "waiting"
    assert missing(A, ["H100", "A100"], profiles, failed) == [(A, "H100")]
    assert missing(B, ["H100", "A100"], profiles, failed) == []


def test_profiles_go_to_idle_gpus_then_reserve_the_least_busy() -> None:
    gpus = [GpuSlot("n1", 0, "A100", trials=3), GpuSlot("n1", 1, "A100", trials=0),
            GpuSlot("n2", 0, "A100", trials=1), GpuSlot("n2", 1, "H100", trials=2,
                                                        profiling=(B, "H100"))]
    plan = plan_profiles([(A, "A100"), (B, "A100"), (A, "H100")], gpus)
    assert [(s, g.node, g.index) for s, g in plan.start] == [((A, "A100"), "n1", 1)]
    # No idle A100 is left for B: the least busy one drains for it; H100 is busy profiling.
    assert [(s, g.node, g.index) for s, g in plan.reserve] == [((B, "A100"), "n2", 0)]


def test_a_drained_reserved_gpu_starts_its_profile() -> None:
    gpus = [GpuSlot("n1", 0, "A100", trials=0, reserved_for=(A, "A100")),
            GpuSlot("n1", 1, "A100", trials=2, reserved_for=(B, "A100"))]
    plan = plan_profiles([], gpus)
    assert [(s, g.index) for s, g in plan.start] == [((A, "A100"), 0)]
    assert plan.reserve == ()


def _profile(**over: object) -> Profile:
    return Profile.model_validate({"key": A, "arch": "A100", "iter_time_s": 0.05,
                                   "iters_per_epoch": 100,
                                   "demand": Demand(compute_pct=40, memory_mib=2000, cores=2),
                                   **over})


def test_feedback_raises_demands_and_never_lowers_them() -> None:
    p = _profile()
    assert corrected(p, 1000, 10.0, "t1", margin=0.05, tolerance=0.25) is not None  # peaks kept
    same = corrected(p.model_copy(update={"observed_memory_mib": 1000,
                                          "observed_compute_pct": 10.0}),
                     1000, 10.0, "t1", margin=0.05, tolerance=0.25)
    assert same is None
    up = corrected(p, 3000, 60.0, "t1", margin=0.05, tolerance=0.25, count=True)
    assert up is not None
    assert up.demand.memory_mib == 3150 and up.demand.compute_pct == 60.0
    assert up.observed_trials == p.observed_trials + 1 and "t1" in up.corrected
    within = corrected(p, 0, 45.0, "t1", margin=0.05, tolerance=0.25)
    assert within is not None and within.demand == p.demand  # noise within the tolerance
    oom = corrected(p, 5000, 0.0, "t2", margin=0.05, tolerance=0.25, oom_at=2000)
    assert oom is not None and oom.demand.memory_mib == 5000
    assert "out of memory at 2000 MiB" in oom.corrected


@pytest.mark.parametrize("before,retries,give_up", [(0, 0, True), (0, 1, False), (1, 1, True),
                                                     (2, 5, False)])
def test_retries(before: int, retries: int, give_up: bool) -> None:
    after = after_failure(3, before, retries)
    assert after.give_up is give_up and after.failures == before + 1
    assert "exit code 3" in after.reason


def test_out_of_memory_grows_until_no_gpu_has_it() -> None:
    again = after_out_of_memory(2000, 2500, 1.5, 80_000)
    assert not again.give_up and again.memory_mib == 3000
    seen = after_out_of_memory(2000, 5000, 1.5, 80_000)
    assert seen.memory_mib == 5001  # more than it was seen using
    last = after_out_of_memory(60_000, 0, 1.5, 80_000)
    assert last.give_up and last.memory_mib == 90_000 and "larger than any GPU" in last.reason
