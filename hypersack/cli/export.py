"""`hypersack export STUDY --optuna STORAGE_URL`: a HyperSack study written into an
Optuna storage, so that optuna-dashboard and `optuna.visualization` work on it unchanged.

Each trial becomes an Optuna trial in HyperSack's order: its parameters with the
space's distributions, its state (COMPLETED: COMPLETE with its objective, or with every
objective of a multi-objective study, whose metric names Optuna keeps; PRUNED:
PRUNED; FAILED, DIVERGED, CANCELLED: FAIL; waiting: WAITING; running: RUNNING), its
learning curve as intermediate values (the objective at each step), its start and end,
and user attributes: the HyperSack trial id and state, the node and GPU of its last
attempt, attempts, its fused group, its final metrics and the reason it ended."""

from __future__ import annotations

import datetime
import json
import math
import warnings
from collections import defaultdict
from typing import Any

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.client import params_of
from hypersack.cli.results import Reader, goals, values_of
from hypersack.core.errors import AlreadyExists, HyperSackError, InvalidInput
from hypersack.grid.space import parse_space

STUDY_ATTR = "hypersack_study"  # the study attribute naming the HyperSack study exported


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise HyperSackError("export --optuna needs optuna: pip install optuna") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def _when(seconds: float) -> datetime.datetime | None:
    return datetime.datetime.fromtimestamp(seconds) if seconds > 0 else None


def _state(optuna: Any, t: pb.Trial, metrics: list[str]) -> tuple[Any, list[float] | None]:
    """The Optuna state of a trial, and its value of each objective where COMPLETE."""
    states = optuna.trial.TrialState
    values = values_of(t, metrics)
    if values is not None:
        return states.COMPLETE, values
    if t.state == "PRUNED":
        return states.PRUNED, None
    if t.state in ("FAILED", "DIVERGED", "CANCELLED", "COMPLETED"):
        return states.FAIL, None
    if t.state in ("RUNNING", "PAUSED"):
        return states.RUNNING, None
    return states.WAITING, None


def _within(distribution: Any, value: Any) -> bool:
    """Whether an Optuna distribution holds the value (a manual search may ask outside
    the space's ranges: such a parameter goes to the user attributes)."""
    try:
        return bool(distribution._contains(distribution.to_internal_repr(value)))
    except (ValueError, TypeError):
        return False


def export_optuna(client: Reader, study_id: str, storage: str, *, name: str = "",
                  replace: bool = False) -> dict[str, int]:
    """Write the study into the Optuna storage `storage` (an RDB URL such as
    sqlite:///optuna.db) under `name` (default: the study id). An Optuna study of that
    name is replaced only if it was exported from this HyperSack study and `replace`
    says so. Returns how many trials went in, and in which Optuna state."""
    optuna = _optuna()
    study = client.study(study_id)
    trials = sorted(client.trials(study_id), key=lambda t: t.id)
    history = client.history(study_id=study_id)
    space = parse_space(json.loads(study.space_json or "{}"), source=f"study {study.id}")
    from hypersack.grid.adaptive import distributions

    dists = distributions(space)
    curves: dict[str, dict[int, float]] = defaultdict(dict)
    for h in history.steps:
        value = h.metrics.get(study.objective_metric)
        if value is not None and math.isfinite(value):
            curves[h.trial_id][int(h.step)] = float(value)
    name = name or study.id
    try:
        storage_obj = optuna.storages.get_storage(storage)
    except Exception as exc:  # optuna raises many kinds for a bad URL
        raise InvalidInput(f"--optuna {storage!r}: not an Optuna storage ({exc})") from None
    existing = {s.study_name: s for s in optuna.get_all_study_summaries(storage_obj)}
    if name in existing:
        if not replace or existing[name].user_attrs.get(STUDY_ATTR) != study.id:
            raise AlreadyExists(
                f"the Optuna storage has a study named {name!r}"
                + (" (--replace rewrites it)" if existing[name].user_attrs.get(STUDY_ATTR)
                   == study.id else "; --name picks another name"))
        optuna.delete_study(study_name=name, storage=storage_obj)
    g = goals(study)
    target = optuna.create_study(storage=storage_obj, study_name=name,
                                 directions=["maximize" if mode == "max" else "minimize"
                                             for _, mode in g])
    if len(g) > 1:  # optuna-dashboard names the axes of the Pareto front with these
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            target.set_metric_names([m for m, _ in g])
    target.set_user_attr(STUDY_ATTR, study.id)
    target.set_user_attr("objective", study.objective_metric)
    target.set_user_attr("owner", study.owner)
    counts: dict[str, int] = defaultdict(int)
    last_span = {(s.trial_id): s for s in sorted(history.spans, key=lambda s: s.start)}
    for t in trials:
        state, values = _state(optuna, t, [m for m, _ in g])
        params = params_of(t)
        kept = {k: v for k, v in params.items() if k in dists and _within(dists[k], v)}
        span = last_span.get(t.id)
        attrs: dict[str, Any] = {
            "hypersack_trial": t.id, "hypersack_state": t.state, "attempts": t.launches,
            "node": span.node if span else t.node, "gpu": span.gpu_index if span else
            (t.gpu_index if t.gpu_index >= 0 else None),
            "fused_group": t.fused_group, "metrics": dict(t.metrics), "reason": t.reason,
            **{f"param.{k}": v for k, v in params.items() if k not in kept}}
        # A trial that never started (its profile failed) starts and ends when it ended.
        start = (_when(t.started_at) or _when(t.finished_at) or _when(study.submitted_at)
                 or datetime.datetime.now())
        end = (_when(t.finished_at) or start) if state.is_finished() else None
        frozen = optuna.trial.FrozenTrial(
            number=0, trial_id=0, state=state, value=None, values=values,
            datetime_start=start if state != optuna.trial.TrialState.WAITING else None,
            datetime_complete=end, params=kept,
            distributions={k: dists[k] for k in kept}, user_attrs=attrs, system_attrs={},
            intermediate_values=curves.get(t.id, {}))
        target.add_trial(frozen)
        counts[state.name] += 1
    return dict(counts)
