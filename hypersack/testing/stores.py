"""Stores for tests: one that fails on demand, as a read-only or full disk makes SQLite
fail, so that the core's undo is exercised for real."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from hypersack.core.errors import StoreUnavailable
from hypersack.core.types import (
    HistoryStep,
    NodeRecord,
    Profile,
    Span,
    StudyRecord,
    TokenRecord,
    TrialRecord,
    UserRecord,
    WorkloadKey,
)
from hypersack.store.base import AccountRecords, RunRecords, Store
from hypersack.store.memory import MemoryStore


class StoreFailure(StoreUnavailable):
    """What the failing store raises, as SQLite does on a read-only or full disk."""


class _PassAccounts(AccountRecords):
    """The failing store's accounts: its inner store's (a setting's write fails as a
    commit does)."""

    inner: Store

    def put_user(self, user: UserRecord) -> None:
        self.inner.put_user(user)

    def remove_user(self, name: str) -> None:
        self.inner.remove_user(name)

    def list_users(self) -> list[UserRecord]:
        return self.inner.list_users()

    def put_setting(self, key: str, value: str) -> None:
        with self.transaction():  # fails as a commit does (fail_commits)
            self.inner.put_setting(key, value)

    def get_setting(self, key: str) -> str | None:
        return self.inner.get_setting(key)

    def put_token(self, token: TokenRecord) -> None:
        self.inner.put_token(token)

    def list_tokens(self) -> list[TokenRecord]:
        return self.inner.list_tokens()


class _PassRuns(RunRecords):
    """The failing store's runs: its inner store's."""

    inner: Store

    def add_history(self, steps: Sequence[HistoryStep]) -> None:
        self.inner.add_history(steps)

    def history(self, *, study_id: str = "", trial_id: str = "",
                after: tuple[str, int] = ("", -1), limit: int | None = None
                ) -> list[HistoryStep]:
        return self.inner.history(study_id=study_id, trial_id=trial_id, after=after,
                                  limit=limit)

    def last_steps(self, study_id: str) -> dict[str, HistoryStep]:
        return self.inner.last_steps(study_id)

    def add_spans(self, spans: Sequence[Span]) -> None:
        self.inner.add_spans(spans)

    def spans(self, study_id: str) -> list[Span]:
        return self.inner.spans(study_id)


class FailingStore(_PassAccounts, _PassRuns, Store):
    """Another store, with failures injected: `fail_commits` makes that many of the next
    outermost transactions fail as they commit (their changes rolled back), and
    `fail_savepoints` that many savepoints fail as they are released, once
    `savepoints_before` more have been released fine. Set them between calls; the counts
    go down as failures happen."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.fail_commits = 0
        self.fail_savepoints = 0
        self.savepoints_before = 0
        self.failures = 0  # how many failures it raised
        self._depth = 0

    @contextmanager
    def transaction(self) -> Iterator[None]:
        with self.inner.transaction():
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            if self._depth == 0 and self.fail_commits > 0:
                self.fail_commits -= 1
                self.failures += 1
                raise StoreFailure("attempt to write a readonly database (injected)")

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        with self.inner.savepoint():
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            if self.fail_savepoints > 0 and self.savepoints_before > 0:
                self.savepoints_before -= 1
            elif self.fail_savepoints > 0:
                self.fail_savepoints -= 1
                self.failures += 1
                raise StoreFailure("database or disk is full (injected)")

    def failed(self, exc: BaseException) -> bool:
        return super().failed(exc) or self.inner.failed(exc)

    def add_study(self, study: StudyRecord, trials: Sequence[TrialRecord]) -> None:
        self.inner.add_study(study, trials)

    def add_trials(self, trials: Sequence[TrialRecord]) -> None:
        self.inner.add_trials(trials)

    def update_study(self, study: StudyRecord) -> None:
        self.inner.update_study(study)

    def get_study(self, study_id: str) -> StudyRecord:
        return self.inner.get_study(study_id)

    def list_studies(self) -> list[StudyRecord]:
        return self.inner.list_studies()

    def get_trial(self, trial_id: str) -> TrialRecord:
        return self.inner.get_trial(trial_id)

    def list_trials(self, study_id: str | None = None) -> list[TrialRecord]:
        return self.inner.list_trials(study_id)

    def update_trial(self, trial: TrialRecord) -> None:
        self.inner.update_trial(trial)

    def update_trials(self, trials: Sequence[TrialRecord]) -> None:
        self.inner.update_trials(trials)

    def put_node(self, node: NodeRecord) -> None:
        self.inner.put_node(node)

    def remove_node(self, name: str) -> None:
        self.inner.remove_node(name)

    def list_nodes(self) -> list[NodeRecord]:
        return self.inner.list_nodes()

    def put_profile(self, profile: Profile) -> None:
        self.inner.put_profile(profile)

    def get_profile(self, key: WorkloadKey, arch: str) -> Profile | None:
        return self.inner.get_profile(key, arch)

    def list_profiles(self) -> list[Profile]:
        return self.inner.list_profiles()

    def remove_profile(self, key: WorkloadKey, arch: str) -> None:
        self.inner.remove_profile(key, arch)

    def close(self) -> None:
        self.inner.close()


def copy_store(source: Store) -> MemoryStore:
    """A memory store holding what `source` holds now (studies, trials, nodes, profiles):
    an orchestrator rebuilt from it leaves the original untouched."""
    out = MemoryStore()
    trials: dict[str, list[TrialRecord]] = {}
    for t in source.list_trials():
        trials.setdefault(t.study_id, []).append(t)
    for study in source.list_studies():
        out.add_study(study, trials.get(study.id, []))
    for node in source.list_nodes():
        out.put_node(node)
    for p in source.list_profiles():
        out.put_profile(p)
    return out
