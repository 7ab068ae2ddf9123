"""The durable Store: SQLite in WAL mode, one JSON document per record.

WAL with synchronous=NORMAL survives a killed process (kill -9) without losing a
committed transaction; only an operating-system crash may lose the last ones.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from hypersack.core.errors import AlreadyExists, NotFound
from hypersack.core.types import NodeRecord, Profile, StudyRecord, TrialRecord, WorkloadKey
from hypersack.store.base import Store

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS studies (
    id TEXT PRIMARY KEY, seq INTEGER NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS trials (
    id TEXT PRIMARY KEY, study_id TEXT NOT NULL REFERENCES studies(id), doc TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS trials_by_study ON trials(study_id);
CREATE TABLE IF NOT EXISTS nodes (name TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS profiles (
    key TEXT NOT NULL, arch TEXT NOT NULL, doc TEXT NOT NULL, PRIMARY KEY (key, arch));
"""


class SqliteStore(Store):
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()
        self._depth = 0
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.executescript(_SCHEMA)
            row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise RuntimeError(f"{self.path}: schema {row[0]}, this HyperSack reads "
                                   f"{SCHEMA_VERSION}")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self._lock:
            if self._depth:
                self._depth += 1
                try:
                    yield
                finally:
                    self._depth -= 1
                return
            self._db.execute("BEGIN IMMEDIATE")
            self._depth = 1
            try:
                yield
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            else:
                self._db.execute("COMMIT")
            finally:
                self._depth = 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def add_study(self, study: StudyRecord, trials: Sequence[TrialRecord]) -> None:
        with self.transaction():
            try:
                self._db.execute("INSERT INTO studies VALUES (?, ?, ?)",
                                 (study.id, study.seq, study.model_dump_json()))
                self._db.executemany("INSERT INTO trials VALUES (?, ?, ?)",
                                     [(t.id, t.study_id, t.model_dump_json()) for t in trials])
            except sqlite3.IntegrityError as exc:
                raise AlreadyExists(f"study {study.id!r} or one of its trials exists: {exc}"
                                    ) from None

    def update_study(self, study: StudyRecord) -> None:
        with self.transaction():
            cur = self._db.execute("UPDATE studies SET seq=?, doc=? WHERE id=?",
                                   (study.seq, study.model_dump_json(), study.id))
            if cur.rowcount == 0:
                raise NotFound(f"no study {study.id!r}")

    def get_study(self, study_id: str) -> StudyRecord:
        with self._lock:
            row = self._db.execute("SELECT doc FROM studies WHERE id=?", (study_id,)).fetchone()
        if row is None:
            raise NotFound(f"no study {study_id!r}")
        return StudyRecord.model_validate_json(row[0])

    def list_studies(self) -> list[StudyRecord]:
        with self._lock:
            rows = self._db.execute("SELECT doc FROM studies ORDER BY seq").fetchall()
        return [StudyRecord.model_validate_json(r[0]) for r in rows]

    def get_trial(self, trial_id: str) -> TrialRecord:
        with self._lock:
            row = self._db.execute("SELECT doc FROM trials WHERE id=?", (trial_id,)).fetchone()
        if row is None:
            raise NotFound(f"no trial {trial_id!r}")
        return TrialRecord.model_validate_json(row[0])

    def list_trials(self, study_id: str | None = None) -> list[TrialRecord]:
        with self._lock:
            if study_id is None:
                rows = self._db.execute("SELECT doc FROM trials ORDER BY id").fetchall()
            else:
                rows = self._db.execute("SELECT doc FROM trials WHERE study_id=? ORDER BY id",
                                        (study_id,)).fetchall()
        return [TrialRecord.model_validate_json(r[0]) for r in rows]

    def update_trial(self, trial: TrialRecord) -> None:
        with self.transaction():
            cur = self._db.execute("UPDATE trials SET doc=? WHERE id=?",
                                   (trial.model_dump_json(), trial.id))
            if cur.rowcount == 0:
                raise NotFound(f"no trial {trial.id!r}")

    def put_node(self, node: NodeRecord) -> None:
        with self.transaction():
            self._db.execute("INSERT OR REPLACE INTO nodes VALUES (?, ?)",
                             (node.spec.name, node.model_dump_json()))

    def remove_node(self, name: str) -> None:
        with self.transaction():
            self._db.execute("DELETE FROM nodes WHERE name=?", (name,))

    def list_nodes(self) -> list[NodeRecord]:
        with self._lock:
            rows = self._db.execute("SELECT doc FROM nodes ORDER BY name").fetchall()
        return [NodeRecord.model_validate_json(r[0]) for r in rows]

    def put_profile(self, profile: Profile) -> None:
        with self.transaction():
            self._db.execute("INSERT OR REPLACE INTO profiles VALUES (?, ?, ?)",
                             (profile.key.model_dump_json(), profile.arch,
                              profile.model_dump_json()))

    def get_profile(self, key: WorkloadKey, arch: str) -> Profile | None:
        with self._lock:
            row = self._db.execute("SELECT doc FROM profiles WHERE key=? AND arch=?",
                                   (key.model_dump_json(), arch)).fetchone()
        return None if row is None else Profile.model_validate_json(row[0])

    def list_profiles(self) -> list[Profile]:
        with self._lock:
            rows = self._db.execute("SELECT doc FROM profiles").fetchall()
        return sorted((Profile.model_validate_json(r[0]) for r in rows),
                      key=lambda p: (p.key.label(), p.arch))
