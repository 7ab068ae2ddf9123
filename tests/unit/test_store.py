"""The Store contract (hypersack.testing.contracts), run against every implementation,
and what only SQLite adds."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from hypersack.store import MemoryStore, SqliteStore, Store
from hypersack.testing.contracts import StoreContract, sample_profile, sample_study
from hypersack.testing.stores import FailingStore


class TestMemoryStore(StoreContract):
    def make_store(self, tmp_path: Path) -> Store:
        return MemoryStore()


class TestSqliteStore(StoreContract):
    def make_store(self, tmp_path: Path) -> Store:
        return SqliteStore(tmp_path / "h.db")


class TestFailingStoreWhenNothingFails(StoreContract):
    def make_store(self, tmp_path: Path) -> Store:
        return FailingStore(MemoryStore())


def test_sqlite_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    s, trials = sample_study()
    with SqliteStore(path) as a:
        a.add_study(s, trials)
        a.put_profile(sample_profile())
    with SqliteStore(path) as b:
        assert b.get_study("s-1") == s
        assert b.list_trials() == trials
        assert b.list_profiles() == [sample_profile()]
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_savepoint_is_opened_only_where_something_is_written(tmp_path: Path) -> None:
    """An event that writes nothing until its batch's end costs no SAVEPOINT and RELEASE
    statements (at a thousand nodes, two per event were a tenth of the load)."""
    from hypersack.testing.contracts import sample_study

    store = SqliteStore(tmp_path / "s.db")
    s, trials = sample_study()
    store.add_study(s, trials)
    said: list[str] = []
    store._db.set_trace_callback(said.append)
    with store.transaction():
        for _ in range(5):
            with store.savepoint():
                pass
        with store.savepoint():
            store.update_trial(trials[0])
    assert sum(x.startswith("SAVEPOINT") for x in said) == 1
    assert sum(x.startswith("RELEASE") for x in said) == 1
    store.close()
