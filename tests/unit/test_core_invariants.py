"""The core's invariants under random event sequences with the store failing at commit
and at savepoints: after every batch, committed or undone, no GPU or node is over any
capacity, no trial holds two places, memory says what the store says, and an orchestrator
rebuilt from the store holds the same allocations and makes the same next decision."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import StoreUnavailable
from hypersack.core.types import Demand, NodeSpec, Profile, TrialState, WorkloadKey
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    Command,
    Event,
    Heartbeat,
    KillTrial,
    LaunchGroup,
    NodeDrained,
    NodeJoined,
    NodeLost,
    Orchestrator,
    OrchestratorConfig,
    RunningTrial,
    StudyCancelled,
    StudySubmitted,
    Tick,
    TrialFailed,
    TrialFinished,
    TrialOutOfMemory,
    TrialProgress,
    launched,
)
from hypersack.orchestrator.fusion import fused_key
from hypersack.policies.base import Need, compute_capacity, core_units
from hypersack.store import MemoryStore
from hypersack.testing.stores import FailingStore, copy_store

RATIO = 2.0
NODES: dict[str, NodeSpec] = {
    name: parse_shorthand(shorthand).nodes[0].model_copy(update={"name": name})
    for name, shorthand in [("n0", "1x1xA100-80GB@4"), ("n1", "1x2xA100-40GB@6"),
                            ("n2", "1x1xH100-80GB@3")]}
# Workloads: batch size -> (compute %, memory MiB); 512 is large, to make overpacking show.
WORKLOADS = {64: (30.0, 9000), 128: (45.0, 16000), 512: (70.0, 38000)}


def _profiles() -> list[Profile]:
    out = []
    for arch in ("A100", "H100"):
        for bs, (compute, memory) in WORKLOADS.items():
            key = WorkloadKey(model="resnet18", batch_size=bs)
            out.append(Profile(key=key, arch=arch, demand=Demand(
                compute_pct=compute, memory_mib=memory, cores=1), iter_time_s=0.01,
                iters_per_epoch=10))
            for width in (2, 4):  # fused widths, so no profile job is ever needed
                out.append(Profile(key=fused_key(key, width), arch=arch, demand=Demand(
                    compute_pct=min(100.0, compute * (1 + 0.4 * width)),
                    memory_mib=memory + 3000 * width, cores=1), iter_time_s=0.012 * width,
                    iters_per_epoch=10))
    return out


def _space(number: int, batches: list[int], n_lr: int, fusion: str, retries: int) -> Any:
    return parse_space({
        "name": f"s{number % 3}", "models": ["resnet18"],
        "hyperparameters": {"batch_size": batches,
                            "lr": [round(0.01 * (i + 1), 3) for i in range(n_lr)]},
        "settings": {"retries": retries, "policy": "wfd", "fusion": fusion,
                     "max_fusion_width": 4, "epochs": 2,
                     "oversubscription": {"A100": RATIO, "H100": RATIO}}})


def _decision(commands: list[Command]) -> tuple[Any, ...]:
    """What a batch decided, comparable between two orchestrators."""
    launches = sorted((c.trial_id, c.node, c.gpu_index, c.attempt, c.demand, c.stop_at)
                      for c in launched(commands))
    groups = sorted((c.node, c.gpu_index, c.demand, tuple(m.trial_id for m in c.members))
                    for c in commands if isinstance(c, LaunchGroup))
    kills = sorted((c.trial_id, c.node, c.attempt) for c in commands
                   if isinstance(c, KillTrial))
    return tuple(launches), tuple(groups), tuple(kills)


FAILURE = st.sampled_from(["none", "none", "none", "commit", "savepoint"])


class CoreUnderStoreFailures(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(1000.0)
        inner = MemoryStore()
        for p in _profiles():
            inner.put_profile(p)
        self.store = FailingStore(inner)
        self.config = OrchestratorConfig(heartbeat_timeout_s=30.0, restore_grace_s=0.0)
        self.orch = Orchestrator(self.store, self.clock, self.config)
        self.submitted = 0
        self.batches = {"committed": 0, "undone": 0}
        # What each node's agent runs (trial -> (gpu, attempt)): it goes on running when
        # the server loses the node, and reports it when it joins again.
        self.agents: dict[str, dict[str, tuple[int, int]]] = {n: {} for n in NODES}
        # Exits not yet committed: sent again with the next batch, and listed as running
        # by their node until then, as the agent does until the server acknowledges them.
        self.unacked: list[Event] = []

    # ----------------------------------------------------------------- driving
    def _apply(self, events: list[Event], failure: str, where: int) -> None:
        events = [*self.unacked, *events]
        probe = failure == "none"
        expected = None
        if probe and not any(isinstance(e, (Tick, Heartbeat)) for e in events):
            # The same events on an orchestrator rebuilt from the store: it must decide
            # as the live one does (liveness aside: a tick depends on when each node was
            # last heard from, a heartbeat on how long a trial has been left out of the
            # node's heartbeats, and the store keeps neither).
            rebuilt = Orchestrator(copy_store(self.store.inner), self.clock, self.config)
            expected = _decision(rebuilt.handle_batch(events).commands)
        if failure == "commit":
            self.store.fail_commits = 1
        elif failure == "savepoint":
            self.store.fail_savepoints, self.store.savepoints_before = 1, where
        try:
            result = self.orch.handle_batch(events)
        except StoreUnavailable:
            self.batches["undone"] += 1
            self.unacked = [e for e in events if isinstance(
                e, (TrialFinished, TrialFailed, TrialOutOfMemory))]
            return
        finally:
            self.store.fail_commits = self.store.fail_savepoints = 0
        self.unacked = []
        self.batches["committed"] += 1
        # Every event made here is valid: a refusal could only be the store's failure
        # blamed on an event (an exit dropped as if it were bad input).
        assert result.refused == []
        if expected is not None:
            assert _decision(result.commands) == expected
        self._carry_out(result.commands)

    def _carry_out(self, commands: list[Command]) -> None:
        for c in launched(commands):
            self.agents[c.node][c.trial_id] = (c.gpu_index, c.attempt)
        for c in commands:
            if isinstance(c, KillTrial):
                runs = self.agents.get(c.node, {})
                if c.trial_id in runs and (not c.attempt or runs[c.trial_id][1] == c.attempt):
                    del runs[c.trial_id]

    def _running(self) -> list[Any]:
        return [t for t in self.orch.trials() if t.state == TrialState.RUNNING]

    def _reported(self, node: str) -> tuple[RunningTrial, ...]:
        runs = dict(self.agents[node])
        for e in self.unacked:
            if isinstance(e, (TrialFinished, TrialFailed, TrialOutOfMemory)) and e.node == node:
                t = self.orch.trial(e.trial_id)
                runs.setdefault(e.trial_id, (t.gpu_index or 0, e.attempt))
        return tuple(RunningTrial(tid, gpu, attempt=attempt)
                     for tid, (gpu, attempt) in sorted(runs.items()))

    # ----------------------------------------------------------------- rules
    @rule(batches=st.lists(st.sampled_from(sorted(WORKLOADS)), min_size=1, max_size=2,
                           unique=True),
          n_lr=st.integers(1, 6), fusion=st.sampled_from(["off", "auto"]),
          retries=st.integers(0, 2), failure=FAILURE, where=st.integers(0, 3))
    def submit(self, batches: list[int], n_lr: int, fusion: str, retries: int, failure: str,
               where: int) -> None:
        self.submitted += 1
        self._apply([StudySubmitted(_space(self.submitted, batches, n_lr, fusion, retries),
                                    owner="u")], failure, where)

    @rule(node=st.sampled_from(sorted(NODES)), failure=FAILURE, where=st.integers(0, 3))
    def join(self, node: str, failure: str, where: int) -> None:
        self._apply([NodeJoined(NODES[node], self._reported(node))], failure, where)

    @rule(node=st.sampled_from(sorted(NODES)), failure=FAILURE, where=st.integers(0, 3))
    def heartbeat(self, node: str, failure: str, where: int) -> None:
        if self.orch.has_node(node):
            self._apply([Heartbeat(node, self._reported(node))], failure, where)

    @rule(node=st.sampled_from(sorted(NODES)), failure=FAILURE, where=st.integers(0, 3))
    def lose(self, node: str, failure: str, where: int) -> None:
        if self.orch.has_node(node):
            self._apply([NodeLost(node)], failure, where)

    @rule(node=st.sampled_from(sorted(NODES)), draining=st.booleans(), failure=FAILURE,
          where=st.integers(0, 3))
    def drain(self, node: str, draining: bool, failure: str, where: int) -> None:
        if self.orch.has_node(node):
            self._apply([NodeDrained(node, draining)], failure, where)

    @rule(data=st.data(), how=st.lists(st.sampled_from(["ok", "ok", "fail", "oom", "progress"]),
                                        min_size=1, max_size=4),
          failure=FAILURE, where=st.integers(0, 3))
    def exits(self, data: st.DataObject, how: list[str], failure: str, where: int) -> None:
        """Several exits in one batch, as the server batches what arrived together."""
        running = self._running()
        if not running:
            return
        events: list[Event] = []
        for kind in how:
            t = data.draw(st.sampled_from(running))
            assert t.node is not None
            if kind == "ok":
                events.append(TrialFinished(t.id, t.node, {"loss": 0.5}, attempt=t.launches))
            elif kind == "fail":
                events.append(TrialFailed(t.id, t.node, 1, "boom", attempt=t.launches))
            elif kind == "oom":
                events.append(TrialOutOfMemory(t.id, t.node, 0, attempt=t.launches))
            else:
                events.append(TrialProgress(t.id, t.node, 1, {"loss": 0.7},
                                            attempt=t.launches))
        for e in events:
            if not isinstance(e, TrialProgress):
                self.agents.get(e.node, {}).pop(e.trial_id, None)
        self._apply(events, failure, where)

    @rule(data=st.data())
    def agent_forgets(self, data: st.DataObject) -> None:
        """An agent that restarted without a trial (or never got its launch): its
        heartbeats leave it out, and past the grace it runs again."""
        node = data.draw(st.sampled_from(sorted(NODES)))
        if self.agents[node]:
            del self.agents[node][data.draw(st.sampled_from(sorted(self.agents[node])))]

    @rule(data=st.data(), failure=FAILURE, where=st.integers(0, 3))
    def cancel(self, data: st.DataObject, failure: str, where: int) -> None:
        studies = self.orch.studies()
        if studies:
            study = data.draw(st.sampled_from(studies))
            self._apply([StudyCancelled(study.id)], failure, where)

    @rule(seconds=st.sampled_from([1.0, 10.0, 40.0]), failure=FAILURE,
          where=st.integers(0, 3))
    def tick(self, seconds: float, failure: str, where: int) -> None:
        self.clock.advance(seconds)
        self._apply([Tick()], failure, where)

    # ----------------------------------------------------------------- invariants
    @invariant()
    def no_capacity_is_exceeded(self) -> None:
        for node in self.orch.nodes():
            cores = 0
            for gpu in node.spec.gpus:
                compute, memory, _ = self.orch.held(node.spec.name, gpu.index)
                assert compute <= compute_capacity(RATIO), (node.spec.name, gpu.index)
                assert memory <= gpu.memory_mib, (node.spec.name, gpu.index, memory)
            for t in self._running():
                if t.node == node.spec.name and t.demand is not None:
                    cores += Need.of(t.demand).cores
            assert cores <= core_units(node.spec.cores), node.spec.name

    @invariant()
    def each_running_trial_holds_one_place(self) -> None:
        where: dict[str, tuple[str, int]] = {}
        for node in self.orch.nodes():
            for gpu in node.spec.gpus:
                for tid in self.orch.gpu_trials(node.spec.name, gpu.index):
                    assert tid not in where, f"{tid} on {where[tid]} and {node.spec.name}"
                    where[tid] = (node.spec.name, gpu.index)
        running = {t.id: (t.node, t.gpu_index) for t in self._running()}
        assert running == where

    @invariant()
    def memory_says_what_the_store_says(self) -> None:
        assert {t.id: t for t in self.orch.trials()} == \
            {t.id: t for t in self.store.inner.list_trials()}
        assert {s.id: s for s in self.orch.studies()} == \
            {s.id: s for s in self.store.inner.list_studies()}
        assert sorted(p.key.label() + p.arch for p in self.orch.profiles()) == \
            sorted(p.key.label() + p.arch for p in self.store.inner.list_profiles())

    @invariant()
    def counts_per_state_are_a_walk_over_the_trials(self) -> None:
        # The counts are kept as trials change (and undone with them): they must be
        # what walking each study's trials finds, here and in a rebuilt orchestrator.
        rebuilt = Orchestrator(copy_store(self.store.inner), self.clock, self.config)
        for study in self.orch.studies():
            walked = {state: 0 for state in TrialState}
            for t in self.orch.trials(study.id):
                walked[t.state] += 1
            assert self.orch.counts(study.id) == walked
            assert rebuilt.counts(study.id) == walked

    @invariant()
    def a_rebuilt_orchestrator_holds_the_same(self) -> None:
        rebuilt = Orchestrator(copy_store(self.store.inner), self.clock, self.config)
        assert {t.id: t for t in rebuilt.trials()} == {t.id: t for t in self.orch.trials()}
        for node in self.orch.nodes():
            for gpu in node.spec.gpus:
                assert rebuilt.held(node.spec.name, gpu.index) == \
                    self.orch.held(node.spec.name, gpu.index)
        assert rebuilt.decision_inputs() == self.orch.decision_inputs()


CoreUnderStoreFailures.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestCoreUnderStoreFailures = CoreUnderStoreFailures.TestCase


def _one_a100(store: FailingStore) -> Orchestrator:
    orch = Orchestrator(store, ManualClock(100.0), OrchestratorConfig())
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB@88").nodes[0]))
    return orch


def _undone_then_resubmitted() -> tuple[Orchestrator, FailingStore, list[Command]]:
    """The issue's case: study t (4 trials, batch 64) submitted while the store's commit
    fails, then t again with batch sizes 64 and 512 (the same trial ids, other keys)."""
    inner = MemoryStore()
    for bs, memory in ((64, 1000), (512, 60000)):
        inner.put_profile(Profile(key=WorkloadKey(model="resnet18", batch_size=bs),
                                  arch="A100", demand=Demand(compute_pct=20, memory_mib=memory,
                                                             cores=1),
                                  iter_time_s=0.1, iters_per_epoch=100))
    store = FailingStore(inner)
    orch = _one_a100(store)

    def t(batches: list[int], lrs: list[float]) -> Any:
        return parse_space({"name": "t", "models": ["resnet18"],
                            "hyperparameters": {"batch_size": batches, "lr": lrs},
                            "settings": {"policy": "ff", "fusion": "off",
                                         "oversubscription": {"A100": 3.0}}})

    store.fail_commits = 1
    try:
        orch.handle(StudySubmitted(t([64], [0.1, 0.2, 0.3, 0.4])))
        raise AssertionError("the commit should have failed")
    except StoreUnavailable:
        pass
    return orch, store, orch.handle(StudySubmitted(t([64, 512], [0.1, 0.2])))


def test_an_undone_submission_leaves_no_cached_key_behind() -> None:
    orch, _, commands = _undone_then_resubmitted()
    by_trial = {c.trial_id: c.key.batch_size for c in launched(commands)}
    assert by_trial == {t.id: t.key.batch_size for t in orch.trials()
                        if t.state == TrialState.RUNNING}
    _, memory, trials = orch.held("node0", 0)
    assert memory <= 81920, f"{memory} MiB given out of 81920 on one A100-80GB"
    assert trials == 3  # two of batch 64 and one of batch 512 fit; the other 512 waits


def test_an_undone_decision_is_not_counted_or_kept() -> None:
    inner = MemoryStore()
    inner.put_profile(Profile(key=WorkloadKey(model="resnet18", batch_size=64), arch="A100",
                              demand=Demand(compute_pct=20, memory_mib=1000, cores=1),
                              iter_time_s=0.1, iters_per_epoch=100))
    store = FailingStore(inner)
    orch = _one_a100(store)
    space = parse_space({"name": "t", "models": ["resnet18"],
                         "hyperparameters": {"batch_size": [64], "lr": [0.1, 0.2]},
                         "settings": {"fusion": "off"}})
    store.fail_commits = 1
    try:
        orch.handle(StudySubmitted(space))
    except StoreUnavailable:
        pass
    assert (orch.decision_count, len(list(orch.decisions)), orch.decision_time_s) == (0, 0, 0)
    orch.handle(StudySubmitted(space))
    assert orch.decision_count == 1 and len(list(orch.decisions)) == 1
