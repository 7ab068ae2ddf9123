"""SqliteStore's rows that are neither a study's nor a node's: accounts (users, tokens,
the settings the server learned) and runs (trials' curves and attempts). Mixed into
SqliteStore, whose connection and lock they use (`_db`, `_lock`) inside its
transactions."""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Sequence

from hypersack.core.errors import NotFound
from hypersack.core.types import (
    MAX_HISTORY_STEPS,
    HistoryStep,
    Span,
    TokenRecord,
    UserRecord,
    thinned,
)
from hypersack.store.base import AccountRecords, RunRecords


class SqliteAccounts(AccountRecords):
    _db: sqlite3.Connection
    _lock: threading.RLock

    def put_user(self, user: UserRecord) -> None:
        with self.transaction():
            self._db.execute("INSERT OR REPLACE INTO users VALUES (?, ?)",
                             (user.name, user.model_dump_json()))

    def remove_user(self, name: str) -> None:
        with self.transaction():
            self._db.execute("DELETE FROM users WHERE name=?", (name,))

    def list_users(self) -> list[UserRecord]:
        with self._lock:
            rows = self._db.execute("SELECT doc FROM users ORDER BY name").fetchall()
        return [UserRecord.model_validate_json(r[0]) for r in rows]

    def put_setting(self, key: str, value: str) -> None:
        with self.transaction():
            self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)",
                             ("setting:" + key, value))

    def get_setting(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key=?",
                                   ("setting:" + key,)).fetchone()
        return None if row is None else str(row[0])

    def put_token(self, token: TokenRecord) -> None:
        with self.transaction():
            self._db.execute("INSERT OR REPLACE INTO tokens VALUES (?, ?)",
                             (token.id, token.model_dump_json()))

    def list_tokens(self) -> list[TokenRecord]:
        with self._lock:
            rows = self._db.execute("SELECT doc FROM tokens ORDER BY id").fetchall()
        return [TokenRecord.model_validate_json(r[0]) for r in rows]


class SqliteRuns(RunRecords):
    _db: sqlite3.Connection
    _lock: threading.RLock

    def add_history(self, steps: Sequence[HistoryStep]) -> None:
        with self.transaction():
            try:
                self._db.executemany(
                    "INSERT OR REPLACE INTO history VALUES (?, ?, ?, ?)",
                    [(h.trial_id, h.step, h.at, json.dumps(h.metrics)) for h in steps])
            except sqlite3.IntegrityError as exc:
                raise NotFound(f"a trial of this history does not exist: {exc}") from None
            for tid in sorted({h.trial_id for h in steps}):
                (count,) = self._db.execute("SELECT COUNT(*) FROM history WHERE trial_id=?",
                                            (tid,)).fetchone()
                if count <= MAX_HISTORY_STEPS:
                    continue
                all_steps = [r[0] for r in self._db.execute(
                    "SELECT step FROM history WHERE trial_id=?", (tid,))]
                self._db.executemany("DELETE FROM history WHERE trial_id=? AND step=?",
                                     [(tid, step) for step in thinned(all_steps)])

    def history(self, *, study_id: str = "", trial_id: str = "",
                after: tuple[str, int] = ("", -1), limit: int | None = None
                ) -> list[HistoryStep]:
        args = (*after, -1 if limit is None else limit)
        with self._lock:
            if trial_id:
                rows = self._db.execute(
                    "SELECT h.trial_id, h.step, h.at, h.metrics FROM history h "
                    "WHERE h.trial_id=? AND (h.trial_id, h.step) > (?, ?) "
                    "ORDER BY h.trial_id, h.step LIMIT ?", (trial_id, *args)).fetchall()
            else:
                rows = self._db.execute(
                    "SELECT h.trial_id, h.step, h.at, h.metrics FROM history h JOIN trials t "
                    "ON t.id = h.trial_id WHERE t.study_id=? AND (h.trial_id, h.step) > (?, ?) "
                    "ORDER BY h.trial_id, h.step LIMIT ?", (study_id, *args)).fetchall()
        return [HistoryStep(r[0], int(r[1]), float(r[2]), json.loads(r[3])) for r in rows]

    def last_steps(self, study_id: str) -> dict[str, HistoryStep]:
        with self._lock:
            rows = self._db.execute(
                "SELECT h.trial_id, MAX(h.step), h.at, h.metrics FROM history h JOIN trials t "
                "ON t.id = h.trial_id WHERE t.study_id=? GROUP BY h.trial_id",
                (study_id,)).fetchall()
        return {r[0]: HistoryStep(r[0], int(r[1]), float(r[2]), json.loads(r[3])) for r in rows}

    def add_spans(self, spans: Sequence[Span]) -> None:
        # One statement for a batch's spans (one per trial that ended): a thousand exits
        # a second made one INSERT each a tenth of the event worker's time.
        with self.savepoint(), self.transaction():
            try:
                self._db.executemany(
                    "INSERT OR REPLACE INTO spans VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(s.trial_id, s.attempt, s.node, s.gpu_index, s.start, s.end, s.group)
                     for s in spans])
            except sqlite3.IntegrityError as exc:
                raise NotFound(f"no trial among {[s.trial_id for s in spans[:3]]}...: "
                               f"{exc}") from None

    def spans(self, study_id: str) -> list[Span]:
        with self._lock:
            rows = self._db.execute(
                "SELECT s.trial_id, s.attempt, s.node, s.gpu_index, s.start, s.end, s.grp "
                "FROM spans s JOIN trials t ON t.id = s.trial_id WHERE t.study_id=? "
                "ORDER BY s.start, s.trial_id, s.attempt", (study_id,)).fetchall()
        return [Span(r[0], int(r[1]), r[2], int(r[3]), float(r[4]), float(r[5]), r[6])
                for r in rows]
