"""The Python API: `hypersack.Client`, for notebooks and scripts.

    import hypersack
    with hypersack.Client("head:50051", token="hsk_...", tls_ca="ca.crt") as hs:
        study = hs.submit({"name": "mlp", "models": ["digits_mlp"],
                           "hyperparameters": {"batch_size": [64], "lr": [0.01, 0.1]}})
        hs.wait(study.id)
        best = hs.results(study.id).best
        frame = hs.results(study.id).to_dataframe()   # with pandas installed
        curves = hs.results(study.id).history()       # each trial's metrics per epoch

Records are plain frozen dataclasses; errors are HyperSack's own (`NotFound`,
`PermissionDenied`, `Unauthenticated`, `InvalidInput`, ...).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.client import Client as _Rpc
from hypersack.cli.client import params_of
from hypersack.cli.connect import DEFAULT_SERVER, env_token
from hypersack.cli.results import goals, pareto, ranked, values_of
from hypersack.core.bounds import MAX_EXTEND
from hypersack.core.errors import HyperSackError, InvalidInput
from hypersack.core.types import TrialState
from hypersack.grid.space import read_space_file
from hypersack.wire.tls import channel_credentials

TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED"})
TRIAL_TERMINAL = frozenset(s.value for s in TrialState if s.terminal)


@dataclass(frozen=True)
class Study:
    id: str
    name: str
    state: str  # ACTIVE, COMPLETED, FAILED (no trial completed), CANCELLED
    owner: str
    counts: dict[str, int]
    objective_metric: str
    objective_mode: str  # min or max
    submitted_at: float
    warnings: tuple[str, ...] = ()
    # (metric, mode) of every objective: one, or several in a multi-objective study.
    objectives: tuple[tuple[str, str], ...] = ()

    @property
    def done(self) -> bool:
        return self.state in TERMINAL


@dataclass(frozen=True)
class Trial:
    id: str
    study_id: str
    state: str
    params: dict[str, Any]
    metrics: dict[str, float]
    objective: float | None
    reason: str
    node: str
    gpu_index: int | None
    launches: int
    started_at: float | None
    finished_at: float | None
    log_tail: str = field(default="", repr=False)
    epoch: int = 0  # the last step (epoch) it reported (0: none yet)
    last_value: float | None = None  # its objective metric at that epoch
    # A multi-objective study's: its value of every objective (None: it has not all),
    # and whether it is on the study's Pareto front.
    values: tuple[float, ...] | None = None
    pareto: bool = False


class Results(list[Trial]):
    """A study's trials, best objective first (its mode), those without one after."""

    def __init__(self, study: Study, ranked_trials: list[Trial],
                 curves: Callable[[], pb.History] | None = None) -> None:
        super().__init__(ranked_trials)
        self.study = study
        self._curves = curves

    def history(self) -> Any:
        """Every trial's learning curve as a pandas DataFrame: one row per trial and step
        (columns trial, step, at, state, then each metric), in trial then step order."""
        if self._curves is None:
            raise HyperSackError("these results were made without a server to ask")
        states = {t.id: t.state for t in self}
        return curves_frame(self._curves(), states)

    @property
    def best(self) -> Trial | None:
        """The trial with the best objective; None in a multi-objective study, where no
        one trial is best (see `pareto_front`)."""
        if len(self.study.objectives) > 1:
            return None
        return self[0] if self and self[0].objective is not None else None

    def pareto_front(self) -> list[Trial]:
        """A multi-objective study's trials that no other beats on every objective (as
        Optuna's `study.best_trials`), by the first objective; a study of one objective:
        its best trial."""
        if len(self.study.objectives) <= 1:
            return [self[0]] if self and self[0].objective is not None else []
        return [t for t in self if t.pareto]

    def records(self) -> list[dict[str, Any]]:
        """One flat dict per trial: id, state, objective, each parameter and each metric
        (`metric.NAME`), tries, reason."""
        out = []
        several = len(self.study.objectives) > 1
        for t in self:
            out.append({"trial": t.id, "state": t.state, "objective": t.objective,
                        "epoch": t.epoch, "last_value": t.last_value,
                        **({"values": t.values, "pareto": t.pareto} if several else {}),
                        **t.params, **{f"metric.{k}": v for k, v in sorted(t.metrics.items())},
                        "tries": t.launches, "reason": t.reason})
        return out

    def to_dataframe(self) -> Any:
        """A pandas DataFrame of `records()`, indexed by trial id (needs pandas)."""
        try:
            import pandas as pd
        except ImportError:
            raise HyperSackError("to_dataframe() needs pandas: pip install pandas") from None
        return pd.DataFrame.from_records(self.records(), index="trial")


def curve_rows(history: pb.History, states: Mapping[str, str] | None = None
               ) -> list[dict[str, Any]]:
    """One flat dict per (trial, step): trial, step, at, state (when known), metrics."""
    return [{"trial": h.trial_id, "step": int(h.step), "at": h.at,
             **({"state": states.get(h.trial_id, "")} if states is not None else {}),
             **dict(sorted(h.metrics.items()))} for h in history.steps]


def curves_frame(history: pb.History, states: Mapping[str, str] | None = None) -> Any:
    try:
        import pandas as pd
    except ImportError:
        raise HyperSackError("history() needs pandas: pip install pandas") from None
    rows = curve_rows(history, states)
    columns = ["trial", "step", "at", *(["state"] if states is not None else [])]
    return pd.DataFrame.from_records(rows, columns=columns + sorted(
        {k for r in rows for k in r} - set(columns)))


def _study(s: pb.Study) -> Study:
    return Study(id=s.id, name=s.name, state=s.state, owner=s.owner, counts=dict(s.counts),
                 objective_metric=s.objective_metric, objective_mode=s.objective_mode,
                 submitted_at=s.submitted_at, warnings=tuple(s.warnings),
                 objectives=tuple(goals(s)))


def _trial(t: pb.Trial, metrics: Sequence[str] = (), on_front: Set[str] = frozenset()
           ) -> Trial:
    """`metrics`: every objective's, for a multi-objective study (its values)."""
    values = values_of(t, list(metrics)) if len(metrics) > 1 else None
    objective = t.objective if t.has_objective and math.isfinite(t.objective) else None
    return Trial(id=t.id, study_id=t.study_id, state=t.state, params=params_of(t),
                 metrics=dict(t.metrics), objective=objective, reason=t.reason, node=t.node,
                 gpu_index=t.gpu_index if t.gpu_index >= 0 else None, launches=t.launches,
                 started_at=t.started_at or None, finished_at=t.finished_at or None,
                 log_tail=t.log_tail, epoch=int(t.epoch),
                 last_value=t.last_value if t.has_last_value else None,
                 values=tuple(values) if values is not None else None,
                 pareto=t.id in on_front)


class Client:
    """A HyperSack server, from Python. `address` defaults to `$HYPERSACK_SERVER`, the
    token to `$HYPERSACK_TOKEN` (or the file `$HYPERSACK_TOKEN_FILE`), `tls_ca` to
    `$HYPERSACK_TLS_CA`; without a CA the connection is plain (a loopback server)."""

    def __init__(self, address: str | None = None, token: str | None = None, *,
                 tls_ca: str | Path | None = None, tls_cert: str | Path | None = None,
                 tls_key: str | Path | None = None, server_name: str | None = None,
                 timeout_s: float = 30.0) -> None:
        env = os.environ.get
        self.address = address or env("HYPERSACK_SERVER") or DEFAULT_SERVER
        ca = tls_ca or env("HYPERSACK_TLS_CA")
        credentials = None
        if ca:
            credentials = channel_credentials(Path(ca), Path(tls_cert) if tls_cert else None,
                                              Path(tls_key) if tls_key else None)
        if token is None:
            token = env_token()
        self._rpc = _Rpc(self.address, timeout_s, token=token if credentials else None,
                         credentials=credentials, server_name=server_name)
        self._told: dict[str, set[str]] = {}  # per study, the trials `tell` returned

    def close(self) -> None:
        self._rpc.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- studies
    def submit(self, space: Mapping[str, Any] | str | Path) -> Study:
        """A new study from a search space: a dict (as the YAML file would be), or the
        path of a YAML or JSON file."""
        if isinstance(space, Mapping):
            text, source = json.dumps(dict(space)), "search space (dict)"
        else:
            path = Path(space)
            if not path.is_file():
                raise InvalidInput(f"search space file {str(space)!r} does not exist")
            text, source = read_space_file(path), str(path)
        return _study(self._rpc.submit(text, source))

    def study(self, study_id: str) -> Study:
        return _study(self._rpc.study(study_id))

    def studies(self) -> list[Study]:
        return [_study(s) for s in self._rpc.studies()]

    def trials(self, study_id: str) -> list[Trial]:
        return [_trial(t) for t in self._rpc.trials(study_id)]

    def trial(self, trial_id: str) -> Trial:
        return _trial(self._rpc.trial(trial_id))

    def why(self, trial_id: str) -> list[str]:
        """Why a trial is where it is: for a waiting one, what blocks it on each GPU and
        what holds its study back (the lines `hypersack why` prints)."""
        return list(self._rpc.explain(trial_id).lines)

    def history(self, trial_id: str) -> Any:
        """One trial's learning curve as a pandas DataFrame: one row per step it
        reported (columns trial, step, at, then each metric)."""
        return curves_frame(self._rpc.history(trial_id=trial_id))

    def logs(self, trial_id: str) -> str:
        """The tail of a trial's log (your own trials; admins: any)."""
        return self._rpc.trial(trial_id).log_tail

    def cancel(self, study_id: str) -> Study:
        return _study(self._rpc.cancel(study_id))

    def extend(self, study_id: str, trials: int) -> Study:
        """`trials` more trials for a study of adaptive (optuna, manual) or random search,
        active or ended: the sampler goes on with every trial it was told (as Optuna's
        study.optimize again); the study is active again until they end."""
        if isinstance(trials, bool) or not isinstance(trials, int) or \
                not 1 <= trials <= MAX_EXTEND:
            raise InvalidInput(f"extend by 1 to {MAX_EXTEND} trials ({trials!r} given)")
        return _study(self._rpc.extend(study_id, trials))

    def ask(self, study_id: str, params: Mapping[str, Any] | Sequence[Mapping[str, Any]]
            ) -> list[Trial]:
        """Run trials with these parameters (one mapping, or several) on the cluster, in
        a study of `search: {type: manual, trials: N}`: your own optimizer proposes, the
        cluster packs and runs. Each is checked against the study's space; returns the
        new trials (PENDING), whose results `tell` (or `watch`) brings back."""
        batch = [dict(params)] if isinstance(params, Mapping) else [dict(p) for p in params]
        return [_trial(t) for t in self._rpc.ask(study_id, batch)]

    def tell(self, study_id: str, timeout_s: float | None = None) -> list[Trial]:
        """The study's trials that ended since the last `tell` of this client, waiting
        until at least one has (or the study ended, or `timeout_s` passed: then the list
        may be empty). Feed them to your optimizer, then `ask` again."""
        told = self._told.setdefault(study_id, set())

        def ended_now() -> list[Trial]:
            ended = [t for t in self.trials(study_id)
                     if t.state in TRIAL_TERMINAL and t.id not in told]
            told.update(t.id for t in ended)
            return ended

        ended = ended_now()
        if ended or self.study(study_id).done:
            return ended
        # Woken by the server as the study changes (no polling): the trials are read
        # again only when more have ended than this client was told of.
        for update in self._rpc.watch(study_id, 0.0, timeout_s):
            done = sum(n for state, n in update.study.counts.items()
                       if state in TRIAL_TERMINAL)
            if done > len(told) or update.study.state in TERMINAL:
                ended = ended_now()
                if ended or update.study.state in TERMINAL:
                    return ended
        return []

    def watch(self, study_id: str, min_interval_s: float = 0.5) -> Iterator[Study]:
        """The study each time it changes, until it ends (the last one is terminal)."""
        for update in self._rpc.watch(study_id, min_interval_s):
            yield _study(update.study)

    def wait(self, study_id: str, timeout_s: float | None = None) -> Study:
        """Block until the study ends; raises TimeoutError after `timeout_s`."""
        study = self.study(study_id)
        if study.done:
            return study
        for update in self._rpc.watch(study_id, 0.0, timeout_s):  # woken by changes
            study = _study(update.study)
            if study.done:
                return study
        study = self.study(study_id)
        if study.done:
            return study
        raise TimeoutError(f"study {study_id} is still {study.state} after {timeout_s} s")

    def results(self, study_id: str) -> Results:
        study = self._rpc.study(study_id)
        trials = self._rpc.trials(study_id)
        on_front = pareto(study, trials)
        metrics = [m for m, _ in goals(study)]
        # The order `hypersack results` prints.
        return Results(_study(study), [_trial(t, metrics, on_front)
                                       for t in ranked(study, trials, on_front)],
                       lambda: self._rpc.history(study_id=study_id))
