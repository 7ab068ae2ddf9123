"""How a trial's reported metrics end it: diverged, complete, or complete without the
objective. Pure functions of the study's settings and the metrics."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from hypersack.grid.space import Settings


def divergence(settings: Settings, metrics: Mapping[str, float],
               nonfinite: Collection[str]) -> str | None:
    """Why a trial diverged, or None: its objective (or a stop_if metric) was reported
    NaN or infinite, or a stop_if metric went past its bound."""
    watched = [settings.objective.metric, *settings.stop_if]
    for name in watched:
        if name in nonfinite:
            return f"diverged: {name} is NaN or infinite"
    for name, bound in settings.stop_if.items():
        value = metrics.get(name)
        if value is None:
            continue
        if bound.above is not None and value > bound.above:
            return f"diverged: {name} = {value:.6g}, above stop_if {bound.above:g}"
        if bound.below is not None and value < bound.below:
            return f"diverged: {name} = {value:.6g}, below stop_if {bound.below:g}"
    return None


def missing_objective(settings: Settings, metrics: Mapping[str, float],
                      nonfinite: Iterable[str] = ()) -> str | None:
    """What to say of a trial that reported (or completed with) metrics but not its
    objective metric, or None."""
    metric = settings.objective.metric
    if metric in metrics or metric in nonfinite:
        return None
    reported = ", ".join(sorted(metrics)[:12]) or "none"
    return (f"reported no objective metric {metric!r} (it reported: {reported}); check "
            "settings.objective.metric, or set settings.allow_missing_objective")


def stops_study(settings: Settings, metrics: Mapping[str, float],
                nonfinite: Iterable[str] = ()) -> str | None:
    """Why a trial's report stops its study: it reports metrics, none of them the
    objective, and the study does not allow that. None: it does not."""
    if settings.allow_missing_objective or not (metrics or tuple(nonfinite)):
        return None
    return missing_objective(settings, metrics, nonfinite)
