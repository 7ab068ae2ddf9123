"""Reading a database file without a server: `results`, `status` and `logs` with
`--db` (for example `.hypersack/run.db` after `hypersack run`). The same messages a
server would send, built from the store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.core.errors import InvalidInput
from hypersack.core.types import TrialState
from hypersack.grid.settings import Objective
from hypersack.store.sqlite import SqliteStore
from hypersack.wire.convert import history_to_pb, study_to_pb, trial_to_pb


class StoreReader:
    """What `Client` offers for reading, from the database file itself."""

    def __init__(self, path: Path) -> None:
        if not Path(path).is_file():
            raise InvalidInput(f"{path}: no such database (after `hypersack run` it is "
                               "<state-dir>/run.db)")
        self._store = SqliteStore(path)

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> StoreReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _study(self, record: Any) -> pb.Study:
        counts = {s.value: 0 for s in TrialState}
        for t in self._store.list_trials(record.id):
            counts[t.state.value] += 1
        settings = record.space.get("settings", {}) if isinstance(record.space, dict) else {}
        raw = (settings.get("objectives") or [settings.get("objective", {})]) \
            if isinstance(settings, dict) else [{}]
        try:
            goals = [Objective.model_validate(g) for g in raw]
        except (ValueError, TypeError):
            goals = [Objective()]
        return study_to_pb(record, counts, goals or [Objective()])

    def studies(self) -> list[pb.Study]:
        return [self._study(s) for s in self._store.list_studies()]

    def study(self, study_id: str) -> pb.Study:
        return self._study(self._store.get_study(study_id))

    def trials(self, study_id: str) -> list[pb.Trial]:
        record = self._store.get_study(study_id)  # NotFound for an unknown id
        last = self._store.last_steps(study_id)
        objective = self._study(record).objective_metric
        return [trial_to_pb(t, last.get(t.id), objective)
                for t in self._store.list_trials(study_id)]

    def history(self, *, study_id: str = "", trial_id: str = "") -> pb.History:
        if trial_id:
            study_id = self._store.get_trial(trial_id).study_id
        spans = [s for s in self._store.spans(study_id)
                 if not trial_id or s.trial_id == trial_id]
        return history_to_pb(self._store.history(study_id="" if trial_id else study_id,
                                                 trial_id=trial_id), spans)

    def trial(self, trial_id: str) -> pb.Trial:
        return trial_to_pb(self._store.get_trial(trial_id))
