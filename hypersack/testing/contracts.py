"""The contract suites of HyperSack's interfaces, for its own implementations and for
plug-in authors' (as `optuna.testing`): subclass one in a test module whose class name
starts with `Test`, define how to make the thing, and pytest runs every check on it.

    from hypersack.testing.contracts import StoreContract

    class TestMyStore(StoreContract):
        def make_store(self, tmp_path):
            return MyStore(tmp_path / "state")

`StoreContract` (a Store: records, errors, all-or-nothing transactions, users and
tokens), `PolicyContract` (a placement policy: no capacity exceeded, nothing placed
twice, deterministic, on random instances), `DeviceBackendContract` (an agent's device
backend: a sane inventory, samples, environments and demands). Needs pytest and
hypothesis (the `dev` extra).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypersack.agent.devices import DeviceBackend, Measured
from hypersack.core.errors import AlreadyExists, NotFound
from hypersack.core.types import (
    MAX_HISTORY_STEPS,
    Demand,
    GpuSpec,
    HistoryStep,
    NodeRecord,
    NodeSpec,
    Profile,
    Role,
    Span,
    StudyRecord,
    StudyState,
    TokenRecord,
    TrialRecord,
    TrialState,
    UserRecord,
    WorkloadKey,
)
from hypersack.policies.base import ClusterView, GpuBin, Item, Need, NodeBin, Policy
from hypersack.policies.plans import check_plan
from hypersack.store.base import Store

KEY = WorkloadKey(model="resnet18", batch_size=64)


def sample_study(i: int = 1) -> tuple[StudyRecord, list[TrialRecord]]:
    sid = f"s-{i}"
    trials = [TrialRecord(id=f"{sid}-t{j:05d}", study_id=sid, coords=(j,),
                          params={"model": "resnet18", "batch_size": 64, "lr": 0.1 * j},
                          key=KEY, epochs=1) for j in range(3)]
    return StudyRecord(id=sid, name="s", space={"name": "s"}, seq=i), trials


def sample_profile(arch: str = "A100", compute: float = 40.0) -> Profile:
    return Profile(key=KEY, arch=arch, demand=Demand(compute_pct=compute, memory_mib=1500,
                                                     cores=2), iter_time_s=0.02,
                   iters_per_epoch=782)


class StoreContract:
    """Every Store keeps this contract. Define `make_store(tmp_path)`."""

    def make_store(self, tmp_path: Path) -> Store:
        raise NotImplementedError

    @pytest.fixture
    def store(self, tmp_path: Path) -> Iterator[Store]:
        s = self.make_store(tmp_path)
        yield s
        s.close()

    def test_studies_and_trials_round_trip(self, store: Store) -> None:
        s, trials = sample_study()
        store.add_study(s, trials)
        assert store.get_study("s-1") == s
        assert store.list_trials("s-1") == trials
        assert store.get_trial(trials[1].id) == trials[1]
        running = trials[1].model_copy(update={"state": TrialState.RUNNING, "node": "n0",
                                               "gpu_index": 2, "demand": sample_profile().demand})
        store.update_trial(running)
        assert store.get_trial(trials[1].id) == running
        done = s.model_copy(update={"state": StudyState.COMPLETED})
        store.update_study(done)
        assert store.list_studies() == [done]
        s2, t2 = sample_study(2)
        store.add_study(s2, t2)
        assert [x.id for x in store.list_studies()] == ["s-1", "s-2"]
        assert len(store.list_trials()) == 6

    def test_trials_added_to_a_study_later(self, store: Store) -> None:
        # An adaptive search adds its trials as it asks for them; the rung values a pruner
        # ranks on survive the round trip (their epochs as integers again).
        s, trials = sample_study()
        store.add_study(s, trials[:1])
        later = [t.model_copy(update={"rungs": {1: 0.5, 3: 0.25}, "done_epochs": 3.0,
                                      "state": TrialState.PAUSED}) for t in trials[1:]]
        store.add_trials(later)
        assert store.list_trials("s-1") == [trials[0], *later]
        assert store.get_trial(later[0].id).rungs == {1: 0.5, 3: 0.25}
        with pytest.raises(AlreadyExists):
            store.add_trials(later[:1])
        stray = trials[0].model_copy(update={"id": "x-t00000", "study_id": "x"})
        with pytest.raises(NotFound):
            store.add_trials([stray])
        assert len(store.list_trials()) == 3

    def test_errors(self, store: Store) -> None:
        s, trials = sample_study()
        store.add_study(s, trials)
        with pytest.raises(AlreadyExists):
            store.add_study(s, [])
        with pytest.raises(NotFound):
            store.get_study("nope")
        with pytest.raises(NotFound):
            store.get_trial("nope")
        with pytest.raises(NotFound):
            store.update_trial(trials[0].model_copy(update={"id": "nope"}))
        with pytest.raises(NotFound):
            store.update_study(s.model_copy(update={"id": "nope"}))

    def test_transaction_is_all_or_nothing(self, store: Store) -> None:
        s, trials = sample_study()
        store.add_study(s, trials)
        changed = trials[0].model_copy(update={"state": TrialState.RUNNING})
        with pytest.raises(RuntimeError), store.transaction():
            store.update_trial(changed)
            store.put_profile(sample_profile())
            store.put_node(NodeRecord(spec=NodeSpec(name="n0", cores=8, gpus=(
                GpuSpec(index=0, arch="A100", memory_mib=81920),))))
            s3, t3 = sample_study(3)
            store.add_study(s3, t3)
            raise RuntimeError("crash in the middle")
        assert store.get_trial(trials[0].id).state == TrialState.PENDING
        assert store.list_profiles() == []
        assert store.list_nodes() == []
        assert [x.id for x in store.list_studies()] == ["s-1"]
        with store.transaction():
            store.update_trial(changed)
        assert store.get_trial(trials[0].id).state == TrialState.RUNNING

    def test_trials_updated_together_all_or_none(self, store: Store) -> None:
        s, trials = sample_study()
        store.add_study(s, trials)
        running = [t.model_copy(update={"state": TrialState.RUNNING}) for t in trials[:2]]
        store.update_trials(running)
        assert [t.state for t in store.list_trials("s-1")] == [
            TrialState.RUNNING, TrialState.RUNNING, TrialState.PENDING]
        ghost = trials[2].model_copy(update={"id": "s-1-nope", "state": TrialState.RUNNING})
        done = trials[2].model_copy(update={"state": TrialState.COMPLETED})
        with pytest.raises(NotFound, match="s-1-nope"), store.transaction():
            store.update_trials([done, ghost])
        assert store.get_trial(trials[2].id).state == TrialState.PENDING
        store.update_trials([])

    def test_savepoints_undo_their_own_writes_only(self, store: Store) -> None:
        """Nested savepoints inside a transaction (an event's, inside its batch's): one
        that raises undoes what was written inside it, nothing before or after it, also
        where an outer one wrote nothing before it."""
        s, trials = sample_study()
        store.add_study(s, trials)
        running = TrialState.RUNNING

        def state(i: int) -> TrialState:
            return store.get_trial(trials[i].id).state

        with store.transaction():
            with store.savepoint():  # writes nothing before its inner one
                with pytest.raises(RuntimeError), store.savepoint():
                    store.update_trial(trials[0].model_copy(update={"state": running}))
                    raise RuntimeError("refused")
                store.update_trial(trials[1].model_copy(update={"state": running}))
            with pytest.raises(RuntimeError), store.savepoint():
                raise RuntimeError("refused before writing anything")
            with pytest.raises(RuntimeError), store.savepoint():
                with store.savepoint():
                    store.update_trial(trials[2].model_copy(update={"state": running}))
                raise RuntimeError("refused after an inner one wrote")
            store.put_profile(sample_profile())
        assert [state(i) for i in range(3)] == [TrialState.PENDING, running,
                                                TrialState.PENDING]
        assert len(store.list_profiles()) == 1

    def test_learning_curves_and_spans(self, store: Store) -> None:
        s, trials = sample_study()
        store.add_study(s, trials)
        a, b = trials[0].id, trials[1].id
        store.add_history([HistoryStep(a, 1, 10.0, {"loss": 0.5}),
                           HistoryStep(a, 2, 11.0, {"loss": 0.25, "acc": 0.9}),
                           HistoryStep(b, 1, 12.0, {"loss": 0.7})])
        store.add_history([HistoryStep(a, 2, 13.0, {"loss": 0.2})])  # a step again: replaced
        assert store.history(trial_id=a) == [HistoryStep(a, 1, 10.0, {"loss": 0.5}),
                                             HistoryStep(a, 2, 13.0, {"loss": 0.2})]
        assert [(h.trial_id, h.step) for h in store.history(study_id="s-1")] == \
            [(a, 1), (a, 2), (b, 1)]
        page = store.history(study_id="s-1", after=(a, 1), limit=1)
        assert [(h.trial_id, h.step) for h in page] == [(a, 2)]
        assert {k: v.step for k, v in store.last_steps("s-1").items()} == {a: 2, b: 1}
        with pytest.raises(NotFound):
            store.add_history([HistoryStep("nope", 1, 1.0, {})])
        with pytest.raises(RuntimeError), store.transaction():
            store.add_history([HistoryStep(b, 2, 14.0, {"loss": 0.1})])
            store.add_spans([Span(b, 1, "n0", 0, 1.0, 2.0)])
            raise RuntimeError("undone")
        assert store.last_steps("s-1")[b].step == 1 and store.spans("s-1") == []
        store.add_spans([Span(a, 2, "n0", 1, 5.0, 7.0, "g1")])
        store.add_spans([Span(a, 2, "n0", 1, 5.0, 9.0, "g1"), Span(a, 1, "n0", 0, 1.0, 4.0)])
        assert store.spans("s-1") == [Span(a, 1, "n0", 0, 1.0, 4.0),
                                      Span(a, 2, "n0", 1, 5.0, 9.0, "g1")]
        assert store.spans("s-2") == []
        # All or none: a span of an unknown trial refuses the batch.
        with pytest.raises(NotFound):
            store.add_spans([Span(b, 3, "n0", 0, 1.0, 2.0), Span("nope", 1, "n0", 0, 1.0, 2.0)])
        assert [(s.trial_id, s.attempt) for s in store.spans("s-1")] == [(a, 1), (a, 2)]

    def test_a_long_curve_is_thinned_to_its_bound(self, store: Store) -> None:
        s, trials = sample_study()
        store.add_study(s, trials)
        tid = trials[0].id
        for start in range(0, 2500, 500):
            store.add_history([HistoryStep(tid, k, float(k), {"loss": 1.0 / (k + 1)})
                               for k in range(start, start + 500)])
        steps = [h.step for h in store.history(trial_id=tid)]
        assert len(steps) <= MAX_HISTORY_STEPS
        assert steps[0] == 0 and steps[-1] == 2499  # the first and the last kept
        assert steps == sorted(steps) and len(steps) > MAX_HISTORY_STEPS // 2

    def test_nodes_and_profiles(self, store: Store) -> None:
        node = NodeRecord(spec=NodeSpec(name="n0", cores=8, gpus=(
            GpuSpec(index=0, arch="A100", memory_mib=81920, uuid="GPU-1"),)))
        store.put_node(node)
        store.put_node(node.model_copy(update={"draining": True}))
        assert store.list_nodes() == [node.model_copy(update={"draining": True})]
        store.remove_node("n0")
        store.remove_node("n0")
        assert store.list_nodes() == []
        store.put_profile(sample_profile())
        store.put_profile(sample_profile(compute=55.0))
        store.put_profile(sample_profile("H100"))
        assert store.get_profile(KEY, "A100") == sample_profile(compute=55.0)
        assert store.get_profile(KEY, "V100") is None
        assert len(store.list_profiles()) == 2

    def test_profiles_can_be_removed(self, store: Store) -> None:
        key = WorkloadKey(model="mlp", batch_size=0, params=(("width", "64"),))
        p = Profile(key=key, arch="A100", demand=Demand(compute_pct=1, memory_mib=1, cores=1),
                    iter_time_s=1, iters_per_epoch=1)
        store.put_profile(p)
        assert store.get_profile(key, "A100") == p
        store.remove_profile(key, "H100")  # not an error
        store.remove_profile(key, "A100")
        assert store.get_profile(key, "A100") is None and store.list_profiles() == []

    def test_users_and_tokens(self, store: Store) -> None:
        alice = UserRecord(name="alice", role=Role.USER, created_at=1.0)
        with store.transaction():
            store.put_user(UserRecord(name="root", role=Role.ADMIN))
            store.put_user(alice)
            store.put_token(TokenRecord(id="0a", user="alice", sha256="f" * 64))
        assert [u.name for u in store.list_users()] == ["alice", "root"]
        revoked = TokenRecord(id="0a", user="alice", sha256="f" * 64, revoked_at=5.0)
        with pytest.raises(RuntimeError), store.transaction():
            store.put_token(revoked)
            store.remove_user("alice")
            raise RuntimeError("rolled back")
        assert store.list_users()[0] == alice and store.list_tokens()[0].revoked_at == 0.0
        store.put_token(revoked)
        store.remove_user("alice")
        store.remove_user("nobody")  # not an error
        assert [u.name for u in store.list_users()] == ["root"]
        assert store.list_tokens() == [revoked]


@st.composite
def instances(draw: Any, max_items: int = 30) -> tuple[list[Item], ClusterView]:
    archs = ["A100", "H100"]
    nodes = []
    for n in range(draw(st.integers(1, 3))):
        gpus = []
        for g in range(draw(st.integers(1, 4))):
            arch = draw(st.sampled_from(archs))
            compute = draw(st.integers(0, 30000))
            memory = draw(st.integers(0, 40000))
            slots = draw(st.one_of(st.none(), st.integers(0, 3)))
            gpus.append(GpuBin(f"n{n}", g, arch, compute, memory, 30000, 40000, slots))
        cores = draw(st.integers(0, 32000))
        nodes.append(NodeBin(f"n{n}", cores, tuple(gpus), 32000))
    shapes = draw(st.lists(st.fixed_dictionaries({
        arch: st.one_of(st.none(), st.tuples(st.integers(0, 12000), st.integers(0, 20000),
                                             st.integers(0, 8000)))
        for arch in archs}), min_size=1, max_size=5))
    items = []
    for i in range(draw(st.integers(0, max_items))):
        shape = draw(st.sampled_from(shapes))
        needs = {a: Need(*v) for a, v in shape.items() if v is not None}
        items.append(Item(f"t{i}", needs, float(draw(st.integers(1, 5)))))
    return items, ClusterView(tuple(nodes))


class PolicyContract:
    """Every placement policy keeps this contract. Define `make_policy()`."""

    def make_policy(self) -> Policy:
        raise NotImplementedError

    @settings(max_examples=60, deadline=None,
              suppress_health_check=[HealthCheck.too_slow,
                                     HealthCheck.function_scoped_fixture])
    @given(instance=instances())
    def test_keeps_the_invariants_and_decides_the_same_twice(
            self, instance: tuple[list[Item], ClusterView]) -> None:
        items, view = instance
        policy = self.make_policy()
        plan = policy.place(items, view)
        check_plan(items, view, plan)  # nothing over capacity, nothing placed twice
        again = policy.place(items, view)
        assert again.placements == plan.placements and again.unplaced == plan.unplaced


class DeviceBackendContract:
    """Every device backend of an agent keeps this contract. Define `make_backend()`."""

    def make_backend(self) -> DeviceBackend:
        raise NotImplementedError

    def test_inventory_samples_and_environments(self) -> None:
        b = self.make_backend()
        devices = b.devices()
        assert devices and len({d.index for d in devices}) == len(devices)
        assert all(d.arch and d.memory_mib > 0 for d in devices)
        assert math.isfinite(b.cores()) and b.cores() > 0
        for d in devices:
            env = b.env_for(d)
            assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
        assert {s.index for s in b.sample()} <= {d.index for d in devices}
        assert isinstance(b.versions(), str)

    @pytest.mark.parametrize("measured", [Measured(0.0, 0.0), Measured(1.0, 40.4),
                                          Measured(64.0, 1e6)])
    def test_demands_are_finite_and_positive(self, measured: Measured) -> None:
        b = self.make_backend()
        for d in b.devices():
            compute, memory, cores = b.demand(d, measured)
            assert math.isfinite(compute) and compute > 0
            assert isinstance(memory, int) and memory > 0
            assert math.isfinite(cores) and cores > 0
