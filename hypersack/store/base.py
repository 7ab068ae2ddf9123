"""The Store interface. One contract test suite runs against every implementation."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from contextlib import AbstractContextManager

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


class Transactional(ABC):
    """All writes inside `transaction()` land together or not at all.

    Single writer: the server (or the embedded driver) owns the store.
    """

    @abstractmethod
    def transaction(self) -> AbstractContextManager[None]:
        """Group writes; nested calls join the outer transaction."""

    @abstractmethod
    def savepoint(self) -> AbstractContextManager[None]:
        """Inside a transaction: the block's writes are undone if it raises, and the
        transaction goes on. Outside one, a transaction of its own."""

    def failed(self, exc: BaseException) -> bool:
        """Whether an exception raised inside a transaction is this store failing (it
        cannot write: read-only, full, I/O), not the caller's data being refused."""
        return isinstance(exc, StoreUnavailable)


class StudyRecords(Transactional):
    """Studies and their trials."""

    @abstractmethod
    def add_study(self, study: StudyRecord, trials: Sequence[TrialRecord]) -> None:
        """Raises AlreadyExists if the study id or a trial id exists."""

    @abstractmethod
    def add_trials(self, trials: Sequence[TrialRecord]) -> None:
        """Trials of existing studies (an adaptive search makes them as it goes). Raises
        NotFound for an unknown study, AlreadyExists if a trial id exists."""

    @abstractmethod
    def update_study(self, study: StudyRecord) -> None:
        """Raises NotFound for an unknown study."""

    @abstractmethod
    def get_study(self, study_id: str) -> StudyRecord: ...

    @abstractmethod
    def list_studies(self) -> list[StudyRecord]:
        """In submission order (seq)."""

    @abstractmethod
    def get_trial(self, trial_id: str) -> TrialRecord: ...

    @abstractmethod
    def list_trials(self, study_id: str | None = None) -> list[TrialRecord]:
        """Ordered by trial id (which follows the expansion order within a study)."""

    @abstractmethod
    def update_trial(self, trial: TrialRecord) -> None:
        """Raises NotFound for an unknown trial."""

    def update_trials(self, trials: Sequence[TrialRecord]) -> None:
        """Several at once (a batch's), all or none; NotFound for an unknown trial."""
        with self.transaction():
            for t in trials:
                self.update_trial(t)


class ClusterRecords(Transactional):
    """The node inventory and the profile history."""

    @abstractmethod
    def put_node(self, node: NodeRecord) -> None: ...

    @abstractmethod
    def remove_node(self, name: str) -> None:
        """Removing an unknown node is not an error."""

    @abstractmethod
    def list_nodes(self) -> list[NodeRecord]: ...

    @abstractmethod
    def put_profile(self, profile: Profile) -> None:
        """Insert or replace the profile of (key, arch)."""

    @abstractmethod
    def get_profile(self, key: WorkloadKey, arch: str) -> Profile | None: ...

    @abstractmethod
    def list_profiles(self) -> list[Profile]: ...

    @abstractmethod
    def remove_profile(self, key: WorkloadKey, arch: str) -> None:
        """Removing an unknown profile is not an error."""


class AccountRecords(Transactional):
    """Users, their tokens, and the settings the server learned."""

    @abstractmethod
    def put_user(self, user: UserRecord) -> None:
        """Insert or replace the user of that name."""

    @abstractmethod
    def remove_user(self, name: str) -> None:
        """Removing an unknown user is not an error."""

    @abstractmethod
    def list_users(self) -> list[UserRecord]:
        """By name."""

    @abstractmethod
    def put_setting(self, key: str, value: str) -> None:
        """Insert or replace a server-wide setting the server learned (JSON text)."""

    @abstractmethod
    def get_setting(self, key: str) -> str | None:
        """The setting of that key, None if never put."""

    @abstractmethod
    def put_token(self, token: TokenRecord) -> None:
        """Insert or replace the token of that id (a revocation replaces it)."""

    @abstractmethod
    def list_tokens(self) -> list[TokenRecord]:
        """By id; revoked ones too."""


class RunRecords(Transactional):
    """What trials did as they ran: their curves (history) and their attempts (spans)."""

    @abstractmethod
    def add_history(self, steps: Sequence[HistoryStep]) -> None:
        """Insert or replace each (trial, step); a trial keeps at most MAX_HISTORY_STEPS
        (see `thinned`)."""

    @abstractmethod
    def history(self, *, study_id: str = "", trial_id: str = "",
                after: tuple[str, int] = ("", -1), limit: int | None = None
                ) -> list[HistoryStep]:
        """One trial's steps, or every trial's of a study: by trial, then step; those
        after `after` (trial, step), at most `limit`."""

    @abstractmethod
    def last_steps(self, study_id: str) -> dict[str, HistoryStep]:
        """Each trial of a study with a curve: its last step."""

    @abstractmethod
    def add_spans(self, spans: Sequence[Span]) -> None:
        """Insert or replace the span of each (trial, attempt); all or none."""

    @abstractmethod
    def spans(self, study_id: str) -> list[Span]:
        """Every attempt of a study's trials that ran, by start."""


class Store(StudyRecords, ClusterRecords, AccountRecords, RunRecords):
    """Every record kind in one store, one transaction over all of them. The interface is
    split by record kind (the classes above), and so are the implementations' rows."""

    def close(self) -> None:
        """Release resources; the default has none."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
