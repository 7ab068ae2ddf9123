"""The orchestrator as a state machine: events in, commands out, state in the store."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import StaleEvent
from hypersack.core.types import StudyState, TrialState
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    Heartbeat,
    KillTrial,
    LaunchTrial,
    NodeDrained,
    NodeJoined,
    NodeLost,
    Orchestrator,
    OrchestratorConfig,
    ProfileFailed,
    ProfileMeasured,
    ProfileWorkload,
    RunningTrial,
    StudyCancelled,
    StudySubmitted,
    Tick,
    TrialFailed,
    TrialFinished,
    TrialOutOfMemory,
    TrialProgress,
)
from hypersack.policies import ClusterView, Item, Placement, Plan, make_policy, register_policy
from hypersack.policies import registry as policy_registry
from hypersack.store import SqliteStore
from hypersack.testing.core import launches, make, prof, space


def test_submit_places_what_fits_and_the_rest_follows_completions() -> None:
    orch, store, _ = make()
    orch.handle(NodeJoined(parse_shorthand("1x2xA100-80GB").nodes[0]))
    first = launches(orch.handle(StudySubmitted(space(n_lr=6))))
    assert len(first) == 4  # 2 GPUs x ratio 1 x 50 % each
    assert {(c.node, c.gpu_index) for c in first} == {("node0", 0), ("node0", 1)}
    sid = orch.studies()[0].id
    assert [t.state for t in store.list_trials(sid)].count(TrialState.RUNNING) == 4
    orch.handle(TrialProgress(first[0].trial_id, "node0", 5, {"loss": 1.0}))
    nxt = launches(orch.handle(TrialFinished(first[0].trial_id, "node0", {"acc": 0.9}, 0.9)))
    assert len(nxt) == 1 and nxt[0].gpu_index == first[0].gpu_index
    done = store.get_trial(first[0].trial_id)
    assert done.state == TrialState.COMPLETED and done.objective == 0.9
    running = [c.trial_id for c in first[1:] + nxt]
    for tid in running:
        orch.handle(TrialFinished(tid, "node0"))
    last = [t for t in orch.trials(sid) if t.state == TrialState.RUNNING]
    for t in last:
        orch.handle(TrialFinished(t.id, "node0"))
    assert orch.study(sid).state == StudyState.COMPLETED
    assert store.get_study(sid).state == StudyState.COMPLETED
    assert all(t.launches == 1 for t in store.list_trials(sid))


def test_failed_trial_is_retried_then_failed_with_its_log() -> None:
    orch, store, _ = make()
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    tid = launches(orch.handle(StudySubmitted(space(n_lr=1, retries=1))))[0].trial_id
    again = launches(orch.handle(TrialFailed(tid, "node0", 1, "Traceback: boom")))
    assert [c.trial_id for c in again] == [tid]
    assert store.get_trial(tid).failures == 1
    assert launches(orch.handle(TrialFailed(tid, "node0", 1, "Traceback: boom again"))) == []
    t = store.get_trial(tid)
    assert t.state == TrialState.FAILED and t.log_tail == "Traceback: boom again"
    assert "failed 2 times" in t.reason and t.launches == 2
    # Its only trial failed: the study failed, and says so.
    assert orch.study(t.study_id).state == StudyState.FAILED


def test_out_of_memory_returns_to_pending_with_more_memory_and_no_failure() -> None:
    orch, store, _ = make(profiles=[prof("resnet18", 64, memory=30000)])
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    tid = launches(orch.handle(StudySubmitted(space(n_lr=1))))[0].trial_id
    again = launches(orch.handle(TrialOutOfMemory(tid, "node0", observed_memory_mib=31000)))
    assert again[0].demand.memory_mib == 45000
    t = store.get_trial(tid)
    assert t.failures == 0 and t.memory_override_mib == 45000
    # The next death asks for more than any GPU has: FAILED, with the reason.
    third = launches(orch.handle(TrialOutOfMemory(tid, "node0", 50000)))
    assert third[0].demand.memory_mib == 67500
    assert launches(orch.handle(TrialOutOfMemory(tid, "node0", 70000))) == []
    t = store.get_trial(tid)
    assert t.state == TrialState.FAILED and "larger than any GPU" in t.reason


def test_lost_node_requeues_its_trials_elsewhere_and_tick_detects_silence() -> None:
    orch, store, clock = make(heartbeat_timeout_s=10)
    a, b = parse_shorthand("2x1xA100-80GB").nodes
    orch.handle(NodeJoined(a))
    first = launches(orch.handle(StudySubmitted(space(n_lr=4))))
    assert {c.node for c in first} == {"node0"}
    moved = launches(orch.handle(NodeJoined(b)))
    assert {c.node for c in moved} == {"node1"}  # a joining node is used at once
    clock.advance(5)
    orch.handle(Heartbeat("node1", tuple(RunningTrial(c.trial_id, 0) for c in moved)))
    clock.advance(6)  # node0 silent for 11 s, node1 for 6 s
    assert launches(orch.handle(Tick())) == []  # node1 is full
    assert [n.spec.name for n in orch.nodes()] == ["node1"]
    assert [n.spec.name for n in store.list_nodes()] == ["node1"]
    for c in moved:
        orch.handle(TrialFinished(c.trial_id, "node1"))
    sid = orch.studies()[0].id
    assert {t.node for t in orch.trials(sid) if t.state == TrialState.RUNNING} == {"node1"}
    with pytest.raises(StaleEvent):
        orch.handle(TrialFinished(first[0].trial_id, "node0"))


def test_drained_node_gets_no_new_trials_and_running_ones_finish() -> None:
    orch, _, _ = make()
    a, b = parse_shorthand("2x1xA100-80GB").nodes
    orch.handle(NodeJoined(a))
    first = launches(orch.handle(StudySubmitted(space(n_lr=6))))
    orch.handle(NodeDrained("node0"))
    assert launches(orch.handle(TrialFinished(first[0].trial_id, "node0"))) == []
    assert {c.node for c in launches(orch.handle(NodeJoined(b)))} == {"node1"}
    orch.handle(TrialFinished(first[1].trial_id, "node0"))
    assert orch.nodes()[0].draining
    # Undrained, it takes trials again at once.
    assert {c.node for c in launches(orch.handle(NodeDrained("node0", draining=False)))} \
        == {"node0"}
    assert not orch.nodes()[0].draining


def test_reconnecting_agent_keeps_its_trials_and_loses_the_dead_ones() -> None:
    orch, store, _ = make()
    node = parse_shorthand("1x1xA100-80GB").nodes[0]
    orch.handle(NodeJoined(node))
    first = launches(orch.handle(StudySubmitted(space(n_lr=3))))
    assert len(first) == 2
    # The agent re-registers: one trial still runs, one died while it was away, and it
    # also runs something the server never asked for.
    cmds = orch.handle(NodeJoined(node, (RunningTrial(first[0].trial_id, 0),
                                         RunningTrial("ghost-t00001", 0))))
    kills = [c for c in cmds if isinstance(c, KillTrial)]
    assert [k.trial_id for k in kills] == ["ghost-t00001"]
    relaunched = {c.trial_id for c in launches(cmds)}
    assert first[0].trial_id not in relaunched  # adopted, not started twice
    assert first[1].trial_id in relaunched
    assert store.get_trial(first[0].trial_id).launches == 1


def test_profiling_first_then_placement_and_failures_are_explained() -> None:
    orch, store, _ = make(profiles=[])
    orch.handle(NodeJoined(parse_shorthand("1x2xA100-80GB").nodes[0]))
    cmds = orch.handle(StudySubmitted(space(n_lr=2, models=("resnet18", "resnet34"))))
    jobs = [c for c in cmds if isinstance(c, ProfileWorkload)]
    assert {(j.key.model, j.arch) for j in jobs} == {("resnet18", "A100"), ("resnet34", "A100")}
    assert jobs[0].iterations == 10 and jobs[0].warmup == 1
    assert launches(cmds) == []
    sid = orch.studies()[0].id
    assert {t.state for t in orch.trials(sid)} == {TrialState.PROFILING}
    r18 = next(j for j in jobs if j.key.model == "resnet18")
    r34 = next(j for j in jobs if j.key.model == "resnet34")
    after = launches(orch.handle(ProfileMeasured(prof("resnet18", 64), r18.node)))
    assert {c.key.model for c in after} == {"resnet18"}
    assert store.get_profile(r18.key, "A100") is not None  # written to the history
    # The failed run used one trial's parameters: that trial fails, with its own
    # parameters in its reason, and the profile runs again on the other trial's.
    cmds = orch.handle(ProfileFailed(r34.key, "A100", r34.node, "CUDA out of memory"))
    r34s = {t.id: t for t in orch.trials(sid) if t.key.model == "resnet34"}
    first = next(t for t in r34s.values() if t.params == r34.params)
    assert first.state == TrialState.FAILED and "CUDA out of memory" in first.reason
    assert f"lr={r34.params['lr']}" in first.reason
    again = [c for c in cmds if isinstance(c, ProfileWorkload)]
    assert [j.key.model for j in again] == ["resnet34"] and again[0].params != r34.params
    other = next(t for t in r34s.values() if t.id != first.id)
    assert other.state == TrialState.PROFILING
    orch.handle(ProfileFailed(r34.key, "A100", again[0].node, "CUDA out of memory"))
    failed = [t for t in orch.trials(sid) if t.key.model == "resnet34"]
    assert {t.state for t in failed} == {TrialState.FAILED}
    assert f"lr={again[0].params['lr']}" in orch.trial(other.id).reason
    # The user fixes the program and submits again: it is profiled again, not failed at
    # once with the old reason.
    cmds = orch.handle(StudySubmitted(space(n_lr=1, models=("resnet34",))))
    assert [(j.key.model, j.arch) for j in cmds if isinstance(j, ProfileWorkload)] == \
        [("resnet34", "A100")]
    sid2 = orch.studies()[-1].id
    assert {t.state for t in orch.trials(sid2)} == {TrialState.PROFILING}


def test_a_profile_failure_sent_again_does_not_fail_the_next_jobs_trial() -> None:
    """An agent sends a report again until the server acknowledges it. After a failure
    the profile is given again with another trial's parameters, here to the same node:
    a copy of the first failure, naming the first job's trial, is stale (at info) and
    the second trial runs on; its own failure, naming it, counts. A result that names
    no trial (an agent before the field) counts for the job running, as before."""
    orch, _, _ = make(profiles=[])
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    cmds = orch.handle(StudySubmitted(space(n_lr=3, models=("resnet34",))))
    (job,) = [c for c in cmds if isinstance(c, ProfileWorkload)]
    assert job.sample and orch.trial(job.sample).params == job.params
    fail = ProfileFailed(job.key, "A100", job.node, "exit code 1", sample=job.sample)
    (again,) = [c for c in orch.handle(fail) if isinstance(c, ProfileWorkload)]
    assert again.node == job.node and again.sample != job.sample
    with pytest.raises(StaleEvent, match="which ended") as stale:
        orch.handle(fail)  # the copy
    assert stale.value.expected
    assert orch.trial(again.sample).state == TrialState.PROFILING
    # Its own result counts; so does one that names no trial.
    third = [c for c in orch.handle(ProfileFailed(job.key, "A100", job.node, "exit code 2",
                                                  sample=again.sample))
             if isinstance(c, ProfileWorkload)]
    assert orch.trial(again.sample).state == TrialState.FAILED
    assert "exit code 2" in orch.trial(again.sample).reason
    assert launches(orch.handle(ProfileMeasured(prof("resnet34", 64), third[0].node)))


def test_profiling_waits_for_an_idle_gpu_by_draining_one() -> None:
    orch, _, _ = make(profiles=[prof("resnet18", 64)])
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    first = launches(orch.handle(StudySubmitted(space(n_lr=3))))
    cmds = orch.handle(StudySubmitted(space(n_lr=1, models=("resnet34",))))
    assert not [c for c in cmds if isinstance(c, ProfileWorkload)]  # GPU busy: reserved
    cmds = orch.handle(TrialFinished(first[0].trial_id, "node0"))
    assert launches(cmds) == []  # the reserved GPU takes no new trial
    cmds = orch.handle(TrialFinished(first[1].trial_id, "node0"))
    assert [c.key.model for c in cmds if isinstance(c, ProfileWorkload)] == ["resnet34"]


def test_stale_and_unknown_events_change_nothing() -> None:
    orch, store, _ = make()
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    tid = launches(orch.handle(StudySubmitted(space(n_lr=3))))[0].trial_id
    before = store.list_trials()
    for ev in (TrialFinished("nope", "node0"), TrialFinished(tid, "node9"),
               Heartbeat("node9"), NodeLost("node9"),
               TrialProgress("t-t00002", "node0", 1, {"loss": 1.0})):
        with pytest.raises(StaleEvent):
            orch.handle(ev)
    assert store.list_trials() == before


def test_cancel_kills_running_and_cancels_the_rest() -> None:
    orch, store, _ = make()
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    first = launches(orch.handle(StudySubmitted(space(n_lr=4))))
    sid = orch.studies()[0].id
    cmds = orch.handle(StudyCancelled(sid))
    assert sorted(c.trial_id for c in cmds if isinstance(c, KillTrial)) == sorted(
        c.trial_id for c in first)
    assert {t.state for t in store.list_trials(sid)} == {TrialState.CANCELLED}
    assert store.get_study(sid).state == StudyState.CANCELLED
    # The killed attempts' exits then arrive from their node: expected, and they change
    # nothing (the server logs them at info); the same exit from another node is not.
    kill = next(c for c in cmds if isinstance(c, KillTrial))
    before = store.list_trials(sid)
    for node, attempt, expected in (("node0", kill.attempt, True), ("node0", 0, True),
                                    ("node9", kill.attempt, False),
                                    ("node0", kill.attempt + 1, False)):
        with pytest.raises(StaleEvent) as stale:
            orch.handle(TrialFinished(kill.trial_id, node, {"loss": 1.0}, attempt=attempt))
        assert stale.value.expected is expected
    assert store.list_trials(sid) == before


def test_exclusive_mode_runs_one_trial_per_gpu() -> None:
    orch, _, _ = make(exclusive=True)
    orch.handle(NodeJoined(parse_shorthand("1x2xA100-80GB").nodes[0]))
    first = launches(orch.handle(StudySubmitted(space(n_lr=6, ratio=3.0))))
    assert sorted(c.gpu_index for c in first) == [0, 1]


def test_restart_from_sqlite_resumes_without_losing_or_repeating(tmp_path: Path) -> None:
    db = tmp_path / "hs.db"
    clock = ManualClock(0.0)
    orch, _, _ = make(SqliteStore(db), clock=clock, heartbeat_timeout_s=30)
    a, b = parse_shorthand("2x1xA100-80GB").nodes
    orch.handle(NodeJoined(a))
    orch.handle(NodeJoined(b))
    first = launches(orch.handle(StudySubmitted(space(n_lr=8))))
    assert len(first) == 4
    done = first[0]
    orch.handle(TrialFinished(done.trial_id, done.node))
    del orch  # the server dies (nothing is flushed on the way out)

    orch2 = Orchestrator(SqliteStore(db), clock, OrchestratorConfig(heartbeat_timeout_s=30))
    sid = orch2.studies()[0].id
    states = {t.id: t.state for t in orch2.trials(sid)}
    assert states[done.trial_id] == TrialState.COMPLETED
    assert sum(s == TrialState.RUNNING for s in states.values()) == 4  # 3 + 1 relaunched
    running_a = [t for t in orch2.trials(sid) if t.state == TrialState.RUNNING
                 and t.node == a.name]
    # Node a comes back with its trials still running: adopted, nothing launched on it.
    cmds = orch2.handle(NodeJoined(a, tuple(RunningTrial(t.id, 0) for t in running_a)))
    assert not [c for c in cmds if isinstance(c, (KillTrial, LaunchTrial)) and c.node == a.name]
    # Node b never returns: after the heartbeat timeout and the grace a restarted server
    # gives the nodes it restored, its trials run again elsewhere.
    clock.advance(29)
    orch2.handle(Heartbeat(a.name, tuple(RunningTrial(t.id, 0) for t in running_a)))
    orch2.handle(Tick())
    assert orch2.has_node(b.name)  # silent for 29 s, within timeout and grace
    clock.advance(32)
    orch2.handle(Heartbeat(a.name, tuple(RunningTrial(t.id, 0) for t in running_a)))
    orch2.handle(Tick())
    ran: dict[str, int] = {}
    for _ in range(50):
        running = [t for t in orch2.trials(sid) if t.state == TrialState.RUNNING]
        if not running:
            break
        for t in running:
            orch2.handle(TrialFinished(t.id, t.node or ""))
            ran[t.id] = ran.get(t.id, 0) + 1
    assert orch2.study(sid).state == StudyState.COMPLETED
    trials = orch2.trials(sid)
    assert all(t.state == TrialState.COMPLETED for t in trials)
    assert all(n == 1 for n in ran.values()) and done.trial_id not in ran
    lost_b = [c.trial_id for c in first if c.node == b.name]
    assert all(orch2.trial(t).launches == 2 for t in lost_b)  # run again, once


def test_study_ids_are_numbered_per_name() -> None:
    orch, _, _ = make()

    def named(name: str) -> Any:
        return parse_space({"name": name, "models": ["resnet18"],
                            "hyperparameters": {"batch_size": [64]}})

    for name in ("sp1", "sp2", "sp1", "sp1-1", "sp1"):
        orch.handle(StudySubmitted(named(name)))
    assert [s.id for s in orch.studies()] == ["sp1-1", "sp2-1", "sp1-2", "sp1-1-1", "sp1-3"]


@pytest.mark.parametrize("shorthand", ["1x4xA100-80GB@88", "2x4xA100-80GB@88,1x2xH100-80GB@96",
                                       "1x1xA100-80GB@8"])
def test_the_pending_scan_stops_early_and_passes_the_same_trials(shorthand: str) -> None:
    # `_plain_items` stops once every workload group the study may have waiting has
    # passed what could fit; the batch must be what a scan of every pending trial gives.
    from hypersack.sim.instances import EXAMPLES, submitted

    orch = submitted(EXAMPLES / "sp1.yaml", shorthand)  # trials alone: fusion off
    study_id = orch.decisions[-1].study_id
    pending = orch.book.pending_of(study_id)
    assert pending
    archs = frozenset(g.arch for n in parse_shorthand(shorthand).nodes for g in n.gpus)
    view = orch.s.cluster.view(orch.s.cluster.open_nodes(), {})
    early = orch.decider.plain_items(study_id, pending, archs, view)
    # As a decision reads them: one at a time, in order, only as far as needed.
    lazy = orch.decider.plain_items(study_id, orch.book.pending_in_order(study_id), archs,
                                    view)
    counts = orch.s.pending_groups.pop(study_id)
    full = orch.decider.plain_items(study_id, pending, archs, view)  # every trial
    orch.s.pending_groups[study_id] = counts
    assert sum(counts.values()) == len(pending)
    assert len(full) < len(pending)  # groups hold trials back: the scan may stop early
    assert [it.id for it in early] == [it.id for it in full] == [it.id for it in lazy]
    assert [(it.needs, it.run_time_s) for it in early] == [(it.needs, it.run_time_s)
                                                           for it in full]


def test_a_policy_whose_plan_breaks_a_capacity_launches_nothing(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    # A user's policy that puts every trial on the first GPU, whatever it holds: the
    # orchestrator checks the plan before any launch, launches none of it, says which
    # policy broke what, and schedules again once the policy is fixed.

    class Greedy:
        name = "all-on-one"
        broken = True

        def place(self, items: list[Item], cluster: ClusterView) -> Plan:
            if not Greedy.broken:
                return make_policy("ff").place(items, cluster)
            g = cluster.nodes[0].gpus[0]
            return Plan(tuple(Placement(it.id, g.node, g.index) for it in items), (), 0.0,
                        sum(it.value for it in items))

    monkeypatch.setattr(policy_registry, "_REGISTRY", dict(policy_registry._REGISTRY))
    register_policy("all-on-one", Greedy)
    orch, _, clock = make(profiles=[prof("resnet18", 64, compute=60.0)], policy="all-on-one")
    orch.handle(NodeJoined(parse_shorthand("1x2xA100-80GB").nodes[0]))
    with caplog.at_level("ERROR"):
        cmds = orch.handle(StudySubmitted(space(n_lr=3)))
    assert not launches(cmds)
    assert "policy 'all-on-one' returned a plan" in caplog.text
    assert "over its scaled compute" in caplog.text
    assert "Traceback" not in caplog.text
    Greedy.broken = False
    clock.advance(1.0)
    assert len(launches(orch.handle(Tick()))) == 2  # one per GPU


def test_launch_and_profile_commands_carry_what_the_drivers_need() -> None:
    # The server, the simulator and `plan` never look back into the core for a command.
    orch, _, _ = make(profiles=[])
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB").nodes[0]))
    sp = space(n_lr=2)
    profile_jobs = [c for c in orch.handle(StudySubmitted(sp, owner="ada"))
                    if isinstance(c, ProfileWorkload)]
    assert len(profile_jobs) == 1
    job = profile_jobs[0]
    sample = orch.trials(orch.studies()[0].id)[0]
    assert (job.params, job.epochs, job.program, job.owner) == (
        sample.params, sample.epochs, sp.program, "ada")
    cmds = orch.handle(ProfileMeasured(prof("resnet18", 64), job.node))
    assert launches(cmds) and all(c.program == sp.program and c.owner == "ada"
                                  for c in launches(cmds))


@pytest.mark.parametrize("settings,match", [
    ({"oversubscription": {"a100": 2.0}}, "'a100' is not an architecture of this cluster; "
                                          "did you mean 'A100'?"),
    ({"oversubscription": {"A100-80GB": 2.0}}, "did you mean 'A100'?"),
    ({"demand": {"h100": {"compute_pct": 30, "memory_mib": 1000}}},
     "settings.demand: 'h100' is not an architecture of this cluster; did you mean 'H100'?"),
])
def test_a_near_miss_of_an_architecture_is_refused_naming_the_one_meant(
        settings: dict[str, Any], match: str) -> None:
    """Architectures are matched exactly: a study's ratio for `a100` would never apply to
    the A100 nodes, without a word. Refused at submission; nothing is created."""
    from hypersack.core.errors import InvalidInput

    orch, _, _ = make()
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB@8,1x1xH100-80GB@8").nodes[0]))
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB@8,1x1xH100-80GB@8").nodes[1]))
    sp = parse_space({"name": "s", "models": ["resnet18"],
                      "hyperparameters": {"batch_size": [64]}, "settings": settings})
    with pytest.raises(InvalidInput, match=re.escape(match)):
        orch.handle(StudySubmitted(sp))
    assert orch.studies() == []


def test_an_architecture_no_node_has_is_said_on_the_study() -> None:
    orch, _, _ = make()
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB@8").nodes[0]))
    sp = parse_space({"name": "s", "models": ["resnet18"],
                      "hyperparameters": {"batch_size": [64]},
                      "settings": {"oversubscription": {"A100": 2.0, "V100": 1.5}}})
    orch.handle(StudySubmitted(sp))
    (study,) = orch.studies()
    assert study.warnings == ("settings name architecture(s) V100 that no node or profile "
                              "here has (known here: A100, H100); they apply once such a "
                              "node joins",)


def test_a_configured_ratio_of_a_near_miss_architecture_is_warned_of(
        caplog: pytest.LogCaptureFixture) -> None:
    orch, _, _ = make(oversubscription={"a100": 2.0})
    with caplog.at_level("WARNING"):
        orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB@8").nodes[0]))
    assert "the configured ratios name a100, not A100" in caplog.text
