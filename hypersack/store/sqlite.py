"""The durable Store: SQLite in WAL mode, one JSON document per record.

WAL with synchronous=NORMAL survives a killed process (kill -9) without losing a
committed transaction; only an operating-system crash may lose the last ones.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import socket
import sqlite3
import stat
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from types import TracebackType

from hypersack.core.errors import AlreadyExists, HyperSackError, InvalidInput, NotFound
from hypersack.core.types import (
    NodeRecord,
    Profile,
    StudyRecord,
    TrialRecord,
    WorkloadKey,
)
from hypersack.store.base import Store
from hypersack.store.sqlite_rows import SqliteAccounts, SqliteRuns

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
CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (id TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS history (
    trial_id TEXT NOT NULL REFERENCES trials(id), step INTEGER NOT NULL, at REAL NOT NULL,
    metrics TEXT NOT NULL, PRIMARY KEY (trial_id, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS spans (
    trial_id TEXT NOT NULL REFERENCES trials(id), attempt INTEGER NOT NULL,
    node TEXT NOT NULL, gpu_index INTEGER NOT NULL, start REAL NOT NULL, end REAL NOT NULL,
    grp TEXT NOT NULL, PRIMARY KEY (trial_id, attempt)) WITHOUT ROWID;
"""


def _key_text(key: WorkloadKey) -> str:
    """A workload key as the profiles table's primary key. Demand keys beyond the
    built-in ones appear only when there are some: rows written before they existed
    keep their key."""
    return key.model_dump_json(exclude=None if key.params else {"params"})


class StoreError(HyperSackError):
    """The database file is not one this HyperSack can use."""


class DamagedDatabase(StoreError):
    """The database file is damaged; the message says how to recover what it holds."""


class DatabaseLock:
    """An exclusive lock on the database file itself, held while a server (or a CLI
    command writing with --db) runs: one writer per database, whatever path names it (a
    symbolic link, a hard link, a relative path or a bind mount reach the same file).
    SQLite's own locks are POSIX record locks, which flock(2) does not touch. The holder
    is described in `FILE.lock` beside the real file, so a second server can say who
    holds it."""

    def __init__(self, db: str | Path) -> None:
        path = Path(db)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            raise StoreError(f"cannot open the database {str(db)!r}: {exc.strerror}") from None
        real = Path(os.path.realpath(path))
        self.path = Path(f"{real}.lock")
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StoreError(f"{str(db)!r} is not a regular file")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            try:
                holder = self.path.read_text(errors="replace")[:512].strip()
            except OSError:
                holder = ""
            raise InvalidInput(f"database {str(db)!r} is in use by "
                               f"{holder or 'another process'}; one server per database, "
                               "whatever path names it (stop that one first)") from None
        except BaseException:
            os.close(fd)
            raise
        try:
            self.path.write_text(f"hypersack-server pid {os.getpid()} on "
                                 f"{socket.gethostname()} since "
                                 f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            os.chmod(self.path, 0o600)
        except OSError:
            pass  # only a description; the lock holds without it
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor releases the lock
            self._fd = None


@contextmanager
def locked_store(db: str | Path) -> Iterator[SqliteStore]:
    """A database opened for writing outside a server (CLI commands with --db): refused
    while a server holds it (one writer), released when done."""
    lock = DatabaseLock(db)
    try:
        store = SqliteStore(db)
        try:
            yield store
        finally:
            store.close()
    finally:
        lock.release()


_COLUMNS = {"meta": ("key", "value"), "studies": ("id", "seq", "doc"),
            "trials": ("id", "study_id", "doc"), "nodes": ("name", "doc"),
            "profiles": ("key", "arch", "doc"), "users": ("name", "doc"),
            "tokens": ("id", "doc"), "history": ("trial_id", "step", "at", "metrics"),
            "spans": ("trial_id", "attempt", "node", "gpu_index", "start", "end", "grp")}


class SqliteStore(SqliteAccounts, SqliteRuns, Store):
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            p = Path(self.path)
            p.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            if p.is_dir():
                raise StoreError(f"{self.path} is a directory")
            # Private to its user from the start: studies, trials and logs live here.
            os.close(os.open(p, os.O_RDWR | os.O_CREAT, 0o600))
        self._lock = threading.RLock()
        self._depth = 0
        # Savepoints asked for and not opened yet, outermost first: one is opened only
        # before the first write inside it (`_opened`). Most events write nothing until
        # their batch's end, and two statements per event were a tenth of a thousand
        # nodes' load.
        self._unopened: list[str] = []
        try:
            self._db = sqlite3.connect(self.path, isolation_level=None,
                                       check_same_thread=False)
            with self._lock:
                self._db.execute("PRAGMA journal_mode=WAL")
                self._db.execute("PRAGMA synchronous=NORMAL")
                self._db.execute("PRAGMA cache_size=-65536")
                self._db.execute("PRAGMA foreign_keys=ON")
                self._db.executescript(_SCHEMA)
                self._check_schema()
                damage = self._db.execute("PRAGMA quick_check(1)").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            if "malformed" in str(exc) or "corrupt" in str(exc):
                raise DamagedDatabase(self._damaged(str(exc))) from None
            raise StoreError(f"{self.path}: not a HyperSack database ({exc})") from None
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: not a HyperSack database ({exc})") from None
        if damage != "ok":
            self._db.close()
            raise DamagedDatabase(self._damaged(str(damage)))

    def _damaged(self, detail: str) -> str:
        p = shlex.quote(self.path)
        return (f"{self.path} is damaged ({detail.splitlines()[0][:200]}); recover what it "
                f"holds with `sqlite3 {p} .recover > recovered.sql && sqlite3 new.db < "
                f"recovered.sql` and start on new.db (--db), or restore it from a backup")

    def failed(self, exc: BaseException) -> bool:
        """SQLite's own failures (read-only, full disk, I/O, locked) are the store failing;
        a constraint it enforces (a duplicate id) is the caller's data."""
        return super().failed(exc) or (
            isinstance(exc, sqlite3.Error) and not isinstance(
                exc, (sqlite3.IntegrityError, sqlite3.ProgrammingError, sqlite3.InterfaceError)))

    def _check_schema(self) -> None:
        row = self._db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        if row is None:
            self._db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
        elif str(row[0]) != str(SCHEMA_VERSION):
            raise StoreError(f"{self.path}: schema {str(row[0])[:20]!r}, this HyperSack reads "
                             f"{SCHEMA_VERSION}")
        for table, columns in _COLUMNS.items():
            found = [r[1] for r in self._db.execute(f"PRAGMA table_info({table})")]
            if found != list(columns):
                raise StoreError(f"{self.path}: table {table} has columns {found}, expected "
                                 f"{list(columns)}")

    def transaction(self) -> AbstractContextManager[None]:
        return _Transaction(self)

    def savepoint(self) -> AbstractContextManager[None]:
        return _Savepoint(self)

    def _opened(self) -> None:
        """Before a write inside savepoints: those not opened yet are, outermost first."""
        for name in self._unopened:
            self._db.execute(f"SAVEPOINT {name}")
        self._unopened.clear()

    def _still_unopened(self, name: str) -> bool:
        """Whether the savepoint `name` (the innermost) was never opened; forgets it."""
        if self._unopened and self._unopened[-1] == name:
            self._unopened.pop()
            return True
        return False

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

    def add_trials(self, trials: Sequence[TrialRecord]) -> None:
        with self.transaction():
            for sid in sorted({t.study_id for t in trials}):
                if self._db.execute("SELECT 1 FROM studies WHERE id=?", (sid,)).fetchone() \
                        is None:
                    raise NotFound(f"no study {sid!r}")
            try:
                self._db.executemany("INSERT INTO trials VALUES (?, ?, ?)",
                                     [(t.id, t.study_id, t.model_dump_json()) for t in trials])
            except sqlite3.IntegrityError as exc:
                raise AlreadyExists(f"a trial exists: {exc}") from None

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
        self.update_trials([trial])

    def update_trials(self, trials: Sequence[TrialRecord]) -> None:
        # One statement for a batch's changed trials (an exit's and its successor's).
        with self.transaction():
            cur = self._db.executemany("UPDATE trials SET doc=? WHERE id=?",
                                       [(t.model_dump_json(), t.id) for t in trials])
            if cur.rowcount != len(trials):
                for t in trials:
                    if self._db.execute("SELECT 1 FROM trials WHERE id=?",
                                        (t.id,)).fetchone() is None:
                        raise NotFound(f"no trial {t.id!r}")

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
                             (_key_text(profile.key), profile.arch,
                              profile.model_dump_json()))

    def get_profile(self, key: WorkloadKey, arch: str) -> Profile | None:
        with self._lock:
            row = self._db.execute("SELECT doc FROM profiles WHERE key=? AND arch=?",
                                   (_key_text(key), arch)).fetchone()
        return None if row is None else Profile.model_validate_json(row[0])

    def remove_profile(self, key: WorkloadKey, arch: str) -> None:
        with self.transaction():
            self._db.execute("DELETE FROM profiles WHERE key=? AND arch=?",
                             (_key_text(key), arch))

    def list_profiles(self) -> list[Profile]:
        with self._lock:
            rows = self._db.execute("SELECT doc FROM profiles").fetchall()
        return sorted((Profile.model_validate_json(r[0]) for r in rows),
                      key=lambda p: (p.key.label(), p.arch))


class _Held:
    """A context that holds the store's lock from its start to its end, around `_begin`
    and `_end`. Classes, not generators: every event of every batch opens one or two,
    and a generator's context costs five times as much."""

    __slots__ = ("_store",)

    def __init__(self, store: SqliteStore) -> None:
        self._store = store

    def __enter__(self) -> None:
        st = self._store
        st._lock.acquire()
        try:
            self._begin(st)
        except BaseException:
            st._lock.release()
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            self._end(self._store, kind)
        finally:
            self._store._lock.release()

    def _begin(self, st: SqliteStore) -> None:
        raise NotImplementedError

    def _end(self, st: SqliteStore, kind: type[BaseException] | None) -> None:
        raise NotImplementedError


class _Transaction(_Held):
    """SqliteStore.transaction: the outermost begins, and commits (or rolls back if its
    block raised); a nested one joins it."""

    __slots__ = ("_outer",)

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self._outer = False

    def _begin(self, st: SqliteStore) -> None:
        if st._depth:
            st._opened()
            st._depth += 1
            return
        st._db.execute("BEGIN IMMEDIATE")
        st._depth = 1
        self._outer = True

    def _end(self, st: SqliteStore, kind: type[BaseException] | None) -> None:
        if not self._outer:
            st._depth -= 1
            return
        try:
            st._db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            st._depth = 0


class _Savepoint(_Held):
    """SqliteStore.savepoint: inside a transaction, a savepoint opened only before the
    block's first write (`_opened`), released after it, rolled back if it raised;
    outside one, a transaction of its own."""

    __slots__ = ("_name", "_own")

    def __init__(self, store: SqliteStore) -> None:
        super().__init__(store)
        self._name = ""
        self._own: _Transaction | None = None

    def _begin(self, st: SqliteStore) -> None:
        if not st._depth:
            self._own = _Transaction(st)
            self._own._begin(st)
            return
        self._name = f"sp{st._depth}"
        st._unopened.append(self._name)  # opened at the first write inside
        st._depth += 1

    def _end(self, st: SqliteStore, kind: type[BaseException] | None) -> None:
        if self._own is not None:
            self._own._end(st, kind)
            return
        try:
            if not st._still_unopened(self._name):  # nothing written: nothing to undo
                if kind is not None:
                    st._db.execute(f"ROLLBACK TO {self._name}")
                st._db.execute(f"RELEASE {self._name}")
        finally:
            st._depth -= 1
