"""`hypersack why`: the orchestrator's account of why a trial waits, each constraint named
on each GPU, and what holds its study back."""

from __future__ import annotations

from typing import Any

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import TrialState, UserShare
from hypersack.orchestrator import (
    NodeJoined,
    Orchestrator,
    OrchestratorConfig,
    StudySubmitted,
)
from hypersack.orchestrator.events import NodeDrained
from hypersack.store import MemoryStore
from hypersack.testing.core import prof, study


def _orch(nodes: str = "1x1xA100-80GB", compute: float = 50.0, memory: int = 1000,
          **config: Any) -> Orchestrator:
    store = MemoryStore()
    store.put_profile(prof("resnet18", 64, compute=compute, memory=memory))
    config.setdefault("oversubscription", {"A100": 1.0})
    orch = Orchestrator(store, ManualClock(0.0), OrchestratorConfig(**config))
    for node in parse_shorthand(nodes).nodes:
        orch.handle(NodeJoined(node))
    return orch


def _waiting(orch: Orchestrator, study_id: str) -> str:
    return next(t.id for t in orch.trials(study_id) if t.state == TrialState.PENDING)


def test_a_full_gpu_names_the_compute_it_lacks_and_the_trials_ahead() -> None:
    orch = _orch()
    orch.handle(StudySubmitted(study("a", n=5)))
    running = next(t for t in orch.trials() if t.state == TrialState.RUNNING)
    assert orch.explain(running.id)[0].startswith(f"{running.id} is RUNNING on ")
    waiting = [t.id for t in orch.trials() if t.state == TrialState.PENDING]
    lines = orch.explain(waiting[-1])
    assert lines[0] == f"{waiting[-1]} is PENDING"
    gpu = next(line for line in lines if line.startswith("node0:0"))
    assert "compute: needs 50%, 0% of 100% free" in gpu
    assert "memory" not in gpu and "cores" not in gpu
    assert f"{len(waiting) - 1} trial(s) of its study wait ahead of it" in lines
    assert not any("fits on" in line for line in lines)


def test_memory_and_cores_are_named_where_they_block() -> None:
    # 70 GiB each: compute would fit two trials, memory only one.
    orch = _orch(compute=10.0, memory=70_000)
    orch.handle(StudySubmitted(study("a", n=2)))
    lines = orch.explain(_waiting(orch, "a-1"))
    gpu = next(line for line in lines if line.startswith("node0:0"))
    assert "memory: needs 70000 MiB" in gpu and "compute" not in gpu
    # One core on the node: the second trial waits for cores, not for the GPU.
    orch = _orch("1x1xA100-80GB@1", compute=10.0)
    orch.handle(StudySubmitted(study("a", n=2)))
    gpu = next(line for line in orch.explain(_waiting(orch, "a-1"))
               if line.startswith("node0:0"))
    assert gpu.endswith("cores: needs 1, node has 0 of 1 free"), gpu


def test_a_drained_cluster_and_an_unprofiled_architecture_are_said() -> None:
    orch = _orch("1x1xA100-80GB,1x1xH100-80GB")
    orch.handle(StudySubmitted(study("a", n=4)))
    lines = orch.explain(_waiting(orch, "a-1"))
    assert any(line.startswith("H100: waiting for its workload's profile") for line in lines)
    for node in [n.spec.name for n in orch.nodes()]:
        orch.handle(NodeDrained(node, True))
    lines = orch.explain(_waiting(orch, "a-1"))
    assert any(line.startswith("draining, so taking no new work") for line in lines)
    assert any("no node is connected and open" in line for line in lines)


def test_the_studies_whose_share_goes_first_are_named_to_admins_only() -> None:
    orch = _orch("1x2xA100-80GB")
    orch.handle(StudySubmitted(study("a", n=8), "alice"))  # takes the idle cluster
    orch.handle(StudySubmitted(study("b", n=8), "bob"))
    waiting = _waiting(orch, "a-1")
    line = orch.explain(waiting)[-1]
    assert line.startswith("fair share: its study holds 2.00 of 1.00")
    assert line.endswith("so b-1 (0.00 of 1.00) go first")
    hidden = orch.explain(waiting, others=False)[-1]
    assert hidden.endswith("so 1 studies under theirs go first") and "b-1" not in hidden


def test_fair_share_priority_and_quota_are_said() -> None:
    orch = _orch("1x2xA100-80GB", shares={"bob": UserShare(max_gpus=1)})
    orch.handle(StudySubmitted(study("a", n=8), "alice"))
    orch.handle(StudySubmitted(study("b", n=8), "bob"))
    lines = orch.explain(_waiting(orch, "b-1"))
    assert any(line.startswith("fair share: its study holds") for line in lines), lines
    orch.handle(StudySubmitted(study("c", n=8, priority=5), "carol"))
    lines = orch.explain(_waiting(orch, "b-1"))
    assert any("1 studies of a higher priority wait and go first: c-1" in line
               for line in lines), lines
    # Not an admin: other studies are counted, not named.
    hidden = orch.explain(_waiting(orch, "b-1"), others=False)
    assert not any("c-1" in line for line in hidden)


def test_a_quota_spent_is_said() -> None:
    orch = _orch("1x2xA100-80GB", shares={"bob": UserShare(max_compute=0.5)})
    orch.handle(StudySubmitted(study("b", n=4), "bob"))
    assert sum(t.state == TrialState.RUNNING for t in orch.trials()) == 1
    lines = orch.explain(_waiting(orch, "b-1"))
    assert any("has used their quota of 0.5 GPU-equivalents" in line for line in lines)
    assert any("fits on" in line for line in lines)  # the GPUs have room; the quota not


def test_idle_fits_names_the_gpus_left_empty_while_a_trial_fits_them() -> None:
    # No quota: the decision fills both GPUs (two trials each), so none is idle while
    # the other two wait.
    orch = _orch("1x2xA100-80GB")
    orch.handle(StudySubmitted(study("a", n=6)))
    assert sum(t.state == TrialState.RUNNING for t in orch.trials()) == 4
    assert orch.idle_fits() == []
    # bob's quota holds his second trial back: one GPU stays empty while it would fit.
    orch = _orch("1x2xA100-80GB", shares={"bob": UserShare(max_compute=0.5)})
    orch.handle(StudySubmitted(study("b", n=4), "bob"))
    running = next(t for t in orch.trials() if t.state == TrialState.RUNNING)
    [(node, gpu, trial)] = orch.idle_fits()
    assert (node, gpu) == (running.node, 1 - running.gpu_index)
    assert trial == _waiting(orch, "b-1")
    # Nor does a GPU whose node's cores are spent (two of two, by its other GPU's two
    # trials), while a GPU of the same kind on a node with cores to spare is full.
    orch = _orch("1x2xA100-80GB@2,1x2xA100-80GB@8")
    orch.handle(StudySubmitted(study("d", n=8)))
    assert sum(t.state == TrialState.RUNNING for t in orch.trials()) == 6
    assert orch.idle_fits() == []
    # A trial too large for any GPU does not count.
    orch = _orch("1x2xA100-80GB", memory=90_000)
    orch.handle(StudySubmitted(study("c", n=2)))
    assert not any(t.state == TrialState.RUNNING for t in orch.trials())
    assert orch.idle_fits() == []
