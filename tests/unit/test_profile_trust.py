"""The profile history belongs to someone: a stated demand is its study's own, a command
program's workload lives in its owner's namespace and never under a zoo model's name,
and a node's profile result counts only for the profile job the server gave it."""

from __future__ import annotations

from typing import Any

import pytest

from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import InvalidInput, StaleEvent
from hypersack.core.types import Demand, Profile, WorkloadKey
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    NodeJoined,
    ProfileFailed,
    ProfileMeasured,
    ProfileWorkload,
    StudySubmitted,
)
from hypersack.testing.core import launches, make, prof, study

HUGE = {"compute_pct": 100, "memory_mib": 900000, "cores": 1, "epoch_s": 10}
TINY = {"compute_pct": 0.01, "memory_mib": 1, "cores": 0, "epoch_s": 10}


def command(name: str, **extra: Any) -> Any:
    return parse_space({"name": name, "hyperparameters": {"lr": [0.1, 0.01]},
                        "program": {"command": "{python} train.py --lr {lr}"},
                        "settings": {"fusion": "off", "policy": "ff"}, **extra})


def node(shorthand: str = "1x1xA100-80GB") -> Any:
    return parse_shorthand(shorthand).nodes[0]


def test_a_command_program_cannot_take_a_zoo_models_name() -> None:
    for name in ("resnet18", "alice:resnet18"):
        with pytest.raises(InvalidInput, match="zoo model's name"):
            command("c", workload=name, settings={"demand": HUGE})


@pytest.mark.parametrize("demand", [HUGE, TINY])
def test_a_stated_demand_is_its_studys_own(demand: dict[str, Any]) -> None:
    """A built-in study that states a demand for resnet18 changes no one's resnet18."""
    orch, store, _ = make()  # the history holds a measured resnet18 batch-64 profile
    measured = store.get_profile(WorkloadKey(model="resnet18", batch_size=64), "A100")
    orch.handle(NodeJoined(node("1x4xA100-80GB")))
    orch.handle(StudySubmitted(study("mallory", n=2, demand=demand), owner="mallory"))
    assert store.get_profile(WorkloadKey(model="resnet18", batch_size=64), "A100") == measured
    # Another user's resnet18 study runs on the measured profile: 4 GPUs, 20 trials of
    # 50 % compute at ratio 1.0 -> 2 a GPU (one beside mallory's), not 0 (huge) nor
    # 20 (tiny).
    cmds = orch.handle(StudySubmitted(study("bob", n=20), owner="bob"))
    bob = [t for t in orch.trials() if t.study_id.startswith("bob")]
    per_gpu = [c.gpu_index for c in launches(cmds) if c.trial_id.startswith("bob")]
    assert 7 <= len(per_gpu) <= 8 and max(per_gpu.count(i) for i in set(per_gpu)) == 2
    assert all(t.key == WorkloadKey(model="resnet18", batch_size=64) for t in bob)


def test_command_workloads_live_in_their_owners_namespace() -> None:
    orch, _store, _ = make(profiles=[])
    orch.handle(NodeJoined(node()))
    orch.handle(StudySubmitted(command("a", workload="net", settings={"demand": HUGE}),
                               owner="alice"))
    orch.handle(StudySubmitted(command("b", workload="net"), owner="bob"))
    keys = {t.study_id[0]: t.key.model for t in orch.trials()}
    assert keys == {"a": "alice:net", "b": "bob:net"}
    # Without a workload name, the program's hash is namespaced too.
    orch.handle(StudySubmitted(command("c"), owner="carol"))
    assert next(t.key.model for t in orch.trials("c-1")).startswith("carol:cmd-")
    # Nobody names another's namespace; their own is fine.
    with pytest.raises(InvalidInput, match="this study's owner is 'mallory'"):
        orch.handle(StudySubmitted(command("m", workload="bob:net"), owner="mallory"))
    orch.handle(StudySubmitted(command("d", workload="bob:net2"), owner="bob"))
    assert next(t.key.model for t in orch.trials("d-1")) == "bob:net2"


def test_a_node_reports_only_the_profile_job_it_was_given() -> None:
    orch, store, _ = make(profiles=[])
    orch.handle(NodeJoined(node()))
    orch.handle(NodeJoined(node().model_copy(update={"name": "rogue"})))
    cmds = orch.handle(StudySubmitted(study("s", n=2), owner="ada"))
    (job,) = [c for c in cmds if isinstance(c, ProfileWorkload)]
    other = "rogue" if job.node != "rogue" else "node0"
    forged = prof("resnet18", 64, compute=0.01, memory=1)
    with pytest.raises(StaleEvent, match=f"node {other} was given no profile job"):
        orch.handle(ProfileMeasured(forged, other))
    with pytest.raises(StaleEvent):
        orch.handle(ProfileFailed(job.key, "A100", other, "forged failure"))
    never = Profile(key=WorkloadKey(model="vgg16", batch_size=8), arch="A100",
                    demand=Demand(compute_pct=1, memory_mib=1, cores=0), iter_time_s=0.1,
                    iters_per_epoch=1)
    with pytest.raises(StaleEvent):  # a job no one was given, from the right node too
        orch.handle(ProfileMeasured(never, job.node))
    assert store.list_profiles() == []
    # The node that was given the job reports it, once.
    assert launches(orch.handle(ProfileMeasured(prof("resnet18", 64), job.node)))
    with pytest.raises(StaleEvent):
        orch.handle(ProfileMeasured(forged, job.node))
    assert store.list_profiles() == [prof("resnet18", 64)]
    # The same result sent again (the agent had no acknowledgement yet) changes nothing
    # and is no forgery to refuse: taken quietly, so that the agent stops sending it.
    assert orch.handle(ProfileMeasured(prof("resnet18", 64), job.node)) == []
    assert store.list_profiles() == [prof("resnet18", 64)]
