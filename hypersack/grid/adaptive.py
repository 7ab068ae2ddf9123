"""Model-based search through Optuna (`search: {type: optuna, sampler: ...}`): the only
module that imports `optuna`.

Each study with an Optuna search has an Optuna study in memory, asked for new trials as
capacity frees (`ask`) and told each trial's end (`tell`). It is rebuilt from HyperSack's
own trial records (`rebuild`): after a server restart, and after an event whose handling
was undone. So HyperSack's store is the one source of truth: every asked trial is a
trial record (its number is the trial's ordinal), every ended one carries its outcome and
the objective at each rung, and nothing of Optuna's is kept elsewhere.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from hypersack.core.errors import InvalidInput
from hypersack.core.pareto import objective_values
from hypersack.core.types import TrialRecord, TrialState
from hypersack.grid.params import Choice, IntRange, LogUniform, Uniform, active
from hypersack.grid.space import SearchSpace

if TYPE_CHECKING:  # imported when a study needs it: the server starts without it
    import optuna

log = logging.getLogger(__name__)

# What each sampler needs besides optuna, for the error a user reads.
_EXTRAS = {"gp": "torch and scipy", "cmaes": "cmaes", "qmc": "scipy"}


def _optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise InvalidInput("search type optuna needs the optuna package on the server "
                           "(pip install optuna)") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def distributions(space: SearchSpace) -> dict[str, Any]:
    """The space's hyperparameters (and models) as Optuna distributions. A `num` or
    `step` of a float range is the grid's; Optuna samples the whole range (a `step` is
    kept: the values stay on it)."""
    dist = _optuna().distributions
    out: dict[str, Any] = {}
    if len(space.models) > 1:
        out["model"] = dist.CategoricalDistribution(list(space.models))
    for name, hp in space.hyperparameters.items():
        if isinstance(hp, Choice):
            out[name] = dist.CategoricalDistribution(list(hp.values))
        elif isinstance(hp, IntRange):
            out[name] = dist.IntDistribution(hp.low, hp.high, step=hp.step)
        elif isinstance(hp, LogUniform):
            out[name] = dist.FloatDistribution(hp.low, hp.high, log=True)
        elif isinstance(hp, Uniform):
            step = hp.step if hp.step is not None and hp.low < hp.high else None
            out[name] = dist.FloatDistribution(hp.low, hp.high, step=step)
    return out


def suggest(trial: Any, name: str, distribution: Any) -> Any:
    """Ask a trial for one parameter of this distribution (define-by-run)."""
    dist = _optuna().distributions
    if isinstance(distribution, dist.CategoricalDistribution):
        return trial.suggest_categorical(name, distribution.choices)
    if isinstance(distribution, dist.IntDistribution):
        return trial.suggest_int(name, distribution.low, distribution.high,
                                 step=distribution.step, log=distribution.log)
    return trial.suggest_float(name, distribution.low, distribution.high,
                               step=distribution.step, log=distribution.log)


def make_sampler(space: SearchSpace) -> Any:
    """The sampler the space names, seeded. Raises InvalidInput where the server lacks
    what it needs."""
    optuna = _optuna()
    name, seed = space.search.sampler, space.search.seed
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            if name == "tpe":
                # Constant liar: trials asked but not yet told count as bad, so a batch
                # asked at once spreads out instead of sampling one point many times.
                return optuna.samplers.TPESampler(seed=seed, constant_liar=True)
            if name == "gp":
                import scipy
                import torch  # noqa: F401
                return optuna.samplers.GPSampler(seed=seed)
            if name == "cmaes":
                import cmaes  # noqa: F401
                return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False)
            if name == "nsga2":
                return optuna.samplers.NSGAIISampler(seed=seed)
            if name == "qmc":
                import scipy  # noqa: F401
                return optuna.samplers.QMCSampler(seed=seed, warn_independent_sampling=False)
            return optuna.samplers.RandomSampler(seed=seed)
    except ImportError:
        raise InvalidInput(f"search.sampler {name}: the server needs {_EXTRAS[name]} installed "
                           f"for it (pip install {_EXTRAS[name].replace(' and ', ' ')})"
                           ) from None


def check_search(space: SearchSpace) -> None:
    """Raise InvalidInput now if the space's search cannot run on this server."""
    if space.search.type == "optuna":
        make_sampler(space)
        distributions(space)


class OptunaSearch:
    """One study's Optuna study. Changes in place, so the orchestrator's journal saves it
    as a whole: `save` notes nothing, `restore` marks it stale and the next use rebuilds
    it from the trial records (which the journal restored)."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self._dists = distributions(space)
        self.stale = True
        self._study: optuna.Study | None = None
        self._asked: dict[int, Any] = {}  # trial number -> optuna Trial, until told

    @property
    def directions(self) -> list[str]:
        """Optuna's direction of each objective (one, or several in a multi-objective
        study)."""
        return ["minimize" if o.mode == "min" else "maximize"
                for o in self.space.settings.goals]

    def save(self) -> None:
        return None

    def restore(self, saved: None) -> None:
        self.stale = True

    def rebuild(self, trials: Iterable[TrialRecord]) -> None:
        """A fresh Optuna study holding every trial of the study, in their order: the
        ended ones with their outcome, the others running (constant liar sees them)."""
        optuna = _optuna()
        study = optuna.create_study(directions=self.directions,
                                    sampler=make_sampler(self.space))
        self._asked.clear()
        for i, t in enumerate(sorted(trials, key=lambda t: t.coords)):
            if t.coords != (i,):
                raise InvalidInput(f"trial {t.id}: ordinal {t.coords} where {i} was "
                                   "expected; an Optuna study numbers its trials in turn")
            state, values = outcome(t, self.space)
            params = {k: v for k, v in t.params.items() if k in self._dists}
            frozen = optuna.trial.create_trial(
                params=params, distributions={k: self._dists[k] for k in params},
                values=values, state=state,
                intermediate_values={int(k): v for k, v in t.rungs.items()})
            study.add_trial(frozen)
        self._study = study
        self.stale = False

    def asked(self) -> int:
        assert self._study is not None
        return len(self._study.trials)

    def ask(self) -> tuple[int, dict[str, Any]]:
        """A new trial's number and hyperparameters (the single model where the space
        has one)."""
        assert self._study is not None and not self.stale
        conditional = bool(self.space.conditions())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # Conditional hyperparameters are asked define-by-run, each only where its
            # `when` holds (the sampler sees which trials have it).
            trial = self._study.ask() if conditional else \
                self._study.ask(fixed_distributions=self._dists)
            params: dict[str, Any] = {}
            if len(self.space.models) == 1:
                params["model"] = self.space.models[0]
            for name in ([] if len(self.space.models) <= 1 else ["model"]) + list(
                    self.space.hyperparameters):
                hp = self.space.hyperparameters.get(name)
                if not conditional:
                    params[name] = trial.params[name]
                elif hp is None or active(hp, params):
                    params[name] = suggest(trial, name, self._dists[name])
        self._asked[trial.number] = trial
        return trial.number, params

    def tell(self, t: TrialRecord) -> None:
        """Tell Optuna how an ended trial ended (with its rung values, for a pruned one)."""
        assert self._study is not None and not self.stale
        state, values = outcome(t, self.space)
        number = t.coords[0]
        trial = self._asked.pop(number, None)
        if state == _optuna().trial.TrialState.PRUNED and t.rungs:
            if trial is None:
                # Asked before a rebuild: the rebuild records its rung values.
                self.stale = True
                return
            for step, v in sorted(t.rungs.items()):
                trial.report(v, int(step))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._study.tell(number, values, state=state, skip_if_finished=True)

    def history(self) -> list[tuple[int, str, Any]]:
        """(number, state, value) of every trial Optuna knows, for tests and `show`: the
        value of one objective, the list of several."""
        assert self._study is not None
        multi = len(self.directions) > 1
        return [(ft.number, ft.state.name, ft.values if multi else ft.value)
                for ft in self._study.trials]


def outcome(t: TrialRecord, space: SearchSpace) -> tuple[Any, list[float] | None]:
    """How Optuna records a trial: its state, and its values where it COMPLETED with
    every objective."""
    states = _optuna().trial.TrialState
    values = objective_values(t.state == TrialState.COMPLETED, t.objective, t.metrics,
                              [o.metric for o in space.settings.goals])
    if values is not None:
        return states.COMPLETE, values
    if t.state == TrialState.PRUNED:
        return states.PRUNED, None
    if t.state.terminal:
        return states.FAIL, None
    return states.RUNNING, None

