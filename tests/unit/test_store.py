"""The Store contract, run against every implementation."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypersack.core.errors import AlreadyExists, NotFound
from hypersack.core.types import (
    Demand,
    GpuSpec,
    NodeRecord,
    NodeSpec,
    Profile,
    StudyRecord,
    StudyState,
    TrialRecord,
    TrialState,
    WorkloadKey,
)
from hypersack.store import MemoryStore, SqliteStore, Store

KEY = WorkloadKey(model="resnet18", batch_size=64)


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "h.db")
    yield s
    s.close()


def study(i: int = 1) -> tuple[StudyRecord, list[TrialRecord]]:
    sid = f"s-{i}"
    trials = [TrialRecord(id=f"{sid}-t{j:05d}", study_id=sid, coords=(j,),
                          params={"model": "resnet18", "batch_size": 64, "lr": 0.1 * j},
                          key=KEY, epochs=1) for j in range(3)]
    return StudyRecord(id=sid, name="s", space={"name": "s"}, seq=i), trials


def profile(arch: str = "A100", compute: float = 40.0) -> Profile:
    return Profile(key=KEY, arch=arch, demand=Demand(compute_pct=compute, memory_mib=1500,
                                                     cores=2), iter_time_s=0.02,
                   iters_per_epoch=782)


def test_studies_and_trials_round_trip(store: Store) -> None:
    s, trials = study()
    store.add_study(s, trials)
    assert store.get_study("s-1") == s
    assert store.list_trials("s-1") == trials
    assert store.get_trial(trials[1].id) == trials[1]
    running = trials[1].model_copy(update={"state": TrialState.RUNNING, "node": "n0",
                                           "gpu_index": 2, "demand": profile().demand})
    store.update_trial(running)
    assert store.get_trial(trials[1].id) == running
    done = s.model_copy(update={"state": StudyState.COMPLETED})
    store.update_study(done)
    assert store.list_studies() == [done]
    s2, t2 = study(2)
    store.add_study(s2, t2)
    assert [x.id for x in store.list_studies()] == ["s-1", "s-2"]
    assert len(store.list_trials()) == 6


def test_trials_added_to_a_study_later(store: Store) -> None:
    # An adaptive search adds its trials as it asks for them; the rung values a pruner
    # ranks on survive the round trip (their epochs as integers again).
    s, trials = study()
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


def test_errors(store: Store) -> None:
    s, trials = study()
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


def test_transaction_is_all_or_nothing(store: Store) -> None:
    s, trials = study()
    store.add_study(s, trials)
    changed = trials[0].model_copy(update={"state": TrialState.RUNNING})
    with pytest.raises(RuntimeError), store.transaction():
        store.update_trial(changed)
        store.put_profile(profile())
        store.put_node(NodeRecord(spec=NodeSpec(name="n0", cores=8, gpus=(
            GpuSpec(index=0, arch="A100", memory_mib=81920),))))
        s3, t3 = study(3)
        store.add_study(s3, t3)
        raise RuntimeError("crash in the middle")
    assert store.get_trial(trials[0].id).state == TrialState.PENDING
    assert store.list_profiles() == []
    assert store.list_nodes() == []
    assert [x.id for x in store.list_studies()] == ["s-1"]
    with store.transaction():
        store.update_trial(changed)
    assert store.get_trial(trials[0].id).state == TrialState.RUNNING


def test_nodes_and_profiles(store: Store) -> None:
    node = NodeRecord(spec=NodeSpec(name="n0", cores=8, gpus=(
        GpuSpec(index=0, arch="A100", memory_mib=81920, uuid="GPU-1"),)))
    store.put_node(node)
    store.put_node(node.model_copy(update={"draining": True}))
    assert store.list_nodes() == [node.model_copy(update={"draining": True})]
    store.remove_node("n0")
    store.remove_node("n0")
    assert store.list_nodes() == []
    store.put_profile(profile())
    store.put_profile(profile(compute=55.0))
    store.put_profile(profile("H100"))
    assert store.get_profile(KEY, "A100") == profile(compute=55.0)
    assert store.get_profile(KEY, "V100") is None
    assert len(store.list_profiles()) == 2


def test_profiles_can_be_removed(store: Store) -> None:
    from hypersack.core.types import Demand, Profile, WorkloadKey

    key = WorkloadKey(model="mlp", batch_size=0, params=(("width", "64"),))
    p = Profile(key=key, arch="A100", demand=Demand(compute_pct=1, memory_mib=1, cores=1),
                iter_time_s=1, iters_per_epoch=1)
    store.put_profile(p)
    assert store.get_profile(key, "A100") == p
    store.remove_profile(key, "H100")  # not an error
    store.remove_profile(key, "A100")
    assert store.get_profile(key, "A100") is None and store.list_profiles() == []


def test_users_and_tokens(store: Store) -> None:
    from hypersack.core.types import Role, TokenRecord, UserRecord

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


def test_sqlite_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    s, trials = study()
    with SqliteStore(path) as a:
        a.add_study(s, trials)
        a.put_profile(profile())
    with SqliteStore(path) as b:
        assert b.get_study("s-1") == s
        assert b.list_trials() == trials
        assert b.list_profiles() == [profile()]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
