"""A failed profile run is one trial's failure first (issue 36, 3): the run used one
waiting trial's parameters, and those may be what crashed. That trial fails with its
own parameters in its reason, the profile is tried on another trial's, and the group
fails only when every tried sample failed, each trial's reason saying so."""

from __future__ import annotations

from typing import Any

from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import StudyState, TrialState
from hypersack.orchestrator import (
    NodeJoined,
    ProfileFailed,
    ProfileMeasured,
    ProfileWorkload,
    StudySubmitted,
)
from hypersack.testing.core import launches, make, prof, space


def jobs(cmds: list[object]) -> list[ProfileWorkload]:
    return [c for c in cmds if isinstance(c, ProfileWorkload)]


def start(n_lr: int, **config: object) -> tuple[Any, str, list[ProfileWorkload]]:
    orch, _, _ = make(profiles=[], **config)
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    cmds = orch.handle(StudySubmitted(space(n_lr=n_lr)))
    sid = orch.studies()[0].id
    return orch, sid, jobs(cmds)


def test_a_crash_on_one_trials_parameters_leaves_the_others_running() -> None:
    # The case: the sample's lr crashes the program, other lrs work.
    orch, sid, first = start(n_lr=6)
    assert len(first) == 1
    cmds = orch.handle(ProfileFailed(first[0].key, "A100", first[0].node,
                                     "exit code 1; log tail: ValueError: lr too small"))
    crashed = next(t for t in orch.trials(sid) if t.params == first[0].params)
    assert crashed.state == TrialState.FAILED
    assert "its profile run on A100 failed with its parameters" in crashed.reason
    assert f"lr={first[0].params['lr']}" in crashed.reason
    assert "lr too small" in crashed.reason
    second = jobs(cmds)
    assert len(second) == 1 and second[0].params != first[0].params
    # The second sample measures: the five others run, none failed for the first's crash.
    cmds = orch.handle(ProfileMeasured(prof("resnet18", 64), second[0].node))
    assert launches(cmds)
    states = [t.state for t in orch.trials(sid) if t.id != crashed.id]
    assert TrialState.FAILED not in states and len(states) == 5


def test_the_group_fails_only_after_the_bounded_samples_all_failed() -> None:
    orch, sid, job = start(n_lr=5, profile_samples=3)
    tried: list[dict[str, object]] = []
    for i in range(3):
        assert len(job) == 1, f"sample {i}"
        assert job[0].params not in tried  # each try another trial's parameters
        tried.append(job[0].params)
        job = jobs(orch.handle(ProfileFailed(job[0].key, "A100", job[0].node,
                                             f"exit code 2 (try {i})")))
    assert job == []  # bounded: no fourth run
    trials = orch.trials(sid)
    assert {t.state for t in trials} == {TrialState.FAILED}
    own = [t for t in trials if t.params in tried]
    rest = [t for t in trials if t.params not in tried]
    assert len(own) == 3 and len(rest) == 2
    for t in own:
        assert f"lr={t.params['lr']}" in t.reason  # its own parameters, its own failure
    for t in rest:
        assert "each of the 3 trials tried" in t.reason
        assert "exit code 2 (try 2)" in t.reason
        for o in own:
            assert o.id in t.reason
    assert orch.studies()[0].state != StudyState.ACTIVE


def test_a_study_with_one_trial_fails_after_its_one_sample() -> None:
    orch, sid, job = start(n_lr=1)
    assert jobs(orch.handle(ProfileFailed(job[0].key, "A100", job[0].node, "boom"))) == []
    (t,) = orch.trials(sid)
    assert t.state == TrialState.FAILED and "boom" in t.reason


def test_a_new_study_tries_the_samples_afresh() -> None:
    orch, sid, job = start(n_lr=2, profile_samples=3)
    for _ in range(2):
        job = jobs(orch.handle(ProfileFailed(job[0].key, "A100", job[0].node, "boom")))
    assert job == [] and {t.state for t in orch.trials(sid)} == {TrialState.FAILED}
    again = jobs(orch.handle(StudySubmitted(space(n_lr=4))))
    assert len(again) == 1  # the fixed program is profiled again
    job = jobs(orch.handle(ProfileFailed(again[0].key, "A100", again[0].node, "boom")))
    assert len(job) == 1  # and its count starts from nothing
