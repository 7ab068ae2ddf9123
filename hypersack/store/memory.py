"""An in-memory Store for tests and the simulator; transactions roll back through an undo log."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hypersack.core.errors import AlreadyExists, NotFound
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
    thinned,
)
from hypersack.store.base import AccountRecords, RunRecords, Store, Transactional

_MISSING = object()


class _Tables(Transactional):
    """The tables and their undo log; each record kind's methods are in the classes
    below (one per kind, as the Store interface is split)."""

    def __init__(self) -> None:
        self._studies: dict[str, StudyRecord] = {}
        self._trials: dict[str, TrialRecord] = {}
        self._nodes: dict[str, NodeRecord] = {}
        self._profiles: dict[tuple[WorkloadKey, str], Profile] = {}
        self._users: dict[str, UserRecord] = {}
        self._tokens: dict[str, TokenRecord] = {}
        self._settings: dict[str, str] = {}
        self._history: dict[str, dict[int, HistoryStep]] = {}
        self._spans: dict[tuple[str, int], Span] = {}
        self._undo: list[tuple[dict[Any, Any], Any, Any]] | None = None

    @contextmanager
    def transaction(self) -> Iterator[None]:
        if self._undo is not None:
            yield
            return
        self._undo = []
        try:
            yield
        except BaseException:
            for table, key, old in reversed(self._undo):
                if old is _MISSING:
                    table.pop(key, None)
                else:
                    table[key] = old
            raise
        finally:
            self._undo = None

    @contextmanager
    def savepoint(self) -> Iterator[None]:
        if self._undo is None:
            with self.transaction():
                yield
            return
        mark = len(self._undo)
        try:
            yield
        except BaseException:
            while len(self._undo) > mark:
                table, key, old = self._undo.pop()
                if old is _MISSING:
                    table.pop(key, None)
                else:
                    table[key] = old
            raise

    def _set(self, table: dict[Any, Any], key: Any, value: Any) -> None:
        if self._undo is not None:
            self._undo.append((table, key, table.get(key, _MISSING)))
        if value is _MISSING:
            table.pop(key, None)
        else:
            table[key] = value

    def _ids_of(self, study_id: str) -> list[str]:
        """A study's trial ids, in order."""
        return sorted(t.id for t in self._trials.values() if t.study_id == study_id)


class _Accounts(_Tables, AccountRecords):

    def put_user(self, user: UserRecord) -> None:
        self._set(self._users, user.name, user)

    def remove_user(self, name: str) -> None:
        if name in self._users:
            self._set(self._users, name, _MISSING)

    def list_users(self) -> list[UserRecord]:
        return sorted(self._users.values(), key=lambda u: u.name)

    def put_setting(self, key: str, value: str) -> None:
        self._set(self._settings, key, value)

    def get_setting(self, key: str) -> str | None:
        return self._settings.get(key)

    def put_token(self, token: TokenRecord) -> None:
        self._set(self._tokens, token.id, token)

    def list_tokens(self) -> list[TokenRecord]:
        return sorted(self._tokens.values(), key=lambda t: t.id)


class _Runs(_Tables, RunRecords):

    def add_history(self, steps: Sequence[HistoryStep]) -> None:
        with self.transaction():
            for h in steps:
                if h.trial_id not in self._trials:
                    raise NotFound(f"no trial {h.trial_id!r}")
                if h.trial_id not in self._history:
                    self._set(self._history, h.trial_id, {})
                curve = self._history[h.trial_id]
                self._set(curve, h.step, h)
                for step in thinned(list(curve)):
                    self._set(curve, step, _MISSING)

    def history(self, *, study_id: str = "", trial_id: str = "",
                after: tuple[str, int] = ("", -1), limit: int | None = None
                ) -> list[HistoryStep]:
        ids = [trial_id] if trial_id else self._ids_of(study_id)
        rows = [h for tid in ids for _, h in sorted(self._history.get(tid, {}).items())
                if (h.trial_id, h.step) > after]
        return rows if limit is None else rows[:limit]

    def last_steps(self, study_id: str) -> dict[str, HistoryStep]:
        return {tid: curve[max(curve)] for tid in self._ids_of(study_id)
                if (curve := self._history.get(tid))}

    def add_spans(self, spans: Sequence[Span]) -> None:
        for span in spans:
            if span.trial_id not in self._trials:
                raise NotFound(f"no trial {span.trial_id!r}")
        for span in spans:
            self._set(self._spans, (span.trial_id, span.attempt), span)

    def spans(self, study_id: str) -> list[Span]:
        return sorted((s for s in self._spans.values()
                       if self._trials[s.trial_id].study_id == study_id),
                      key=lambda s: (s.start, s.trial_id, s.attempt))


class MemoryStore(_Accounts, _Runs, Store):
    """Studies, trials, nodes and profiles; accounts and runs from the classes above."""

    def add_study(self, study: StudyRecord, trials: Sequence[TrialRecord]) -> None:
        if study.id in self._studies:
            raise AlreadyExists(f"study {study.id!r} exists")
        self._check_new(trials)
        with self.transaction():
            self._set(self._studies, study.id, study)
            for t in trials:
                self._set(self._trials, t.id, t)

    def add_trials(self, trials: Sequence[TrialRecord]) -> None:
        unknown = [t.study_id for t in trials if t.study_id not in self._studies]
        if unknown:
            raise NotFound(f"no study {unknown[0]!r}")
        self._check_new(trials)
        with self.transaction():
            for t in trials:
                self._set(self._trials, t.id, t)

    def _check_new(self, trials: Sequence[TrialRecord]) -> None:
        ids = [t.id for t in trials]
        clash = [i for i in ids if i in self._trials]
        if clash or len(set(ids)) != len(ids):
            raise AlreadyExists(f"trial ids exist or repeat: {clash[:3] or ids[:3]}")

    def update_study(self, study: StudyRecord) -> None:
        if study.id not in self._studies:
            raise NotFound(f"no study {study.id!r}")
        self._set(self._studies, study.id, study)

    def get_study(self, study_id: str) -> StudyRecord:
        try:
            return self._studies[study_id]
        except KeyError:
            raise NotFound(f"no study {study_id!r}") from None

    def list_studies(self) -> list[StudyRecord]:
        return sorted(self._studies.values(), key=lambda s: s.seq)

    def get_trial(self, trial_id: str) -> TrialRecord:
        try:
            return self._trials[trial_id]
        except KeyError:
            raise NotFound(f"no trial {trial_id!r}") from None

    def list_trials(self, study_id: str | None = None) -> list[TrialRecord]:
        return sorted((t for t in self._trials.values()
                       if study_id is None or t.study_id == study_id), key=lambda t: t.id)

    def update_trial(self, trial: TrialRecord) -> None:
        if trial.id not in self._trials:
            raise NotFound(f"no trial {trial.id!r}")
        self._set(self._trials, trial.id, trial)

    def put_node(self, node: NodeRecord) -> None:
        self._set(self._nodes, node.spec.name, node)

    def remove_node(self, name: str) -> None:
        if name in self._nodes:
            self._set(self._nodes, name, _MISSING)

    def list_nodes(self) -> list[NodeRecord]:
        return sorted(self._nodes.values(), key=lambda n: n.spec.name)

    def put_profile(self, profile: Profile) -> None:
        self._set(self._profiles, (profile.key, profile.arch), profile)

    def get_profile(self, key: WorkloadKey, arch: str) -> Profile | None:
        return self._profiles.get((key, arch))

    def remove_profile(self, key: WorkloadKey, arch: str) -> None:
        if (key, arch) in self._profiles:
            self._set(self._profiles, (key, arch), _MISSING)

    def list_profiles(self) -> list[Profile]:
        return sorted(self._profiles.values(), key=lambda p: (p.key.label(), p.arch))
