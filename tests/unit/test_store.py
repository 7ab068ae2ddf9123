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
