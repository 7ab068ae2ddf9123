"""How a trial's reported metrics end it: diverged, complete, or complete without the
objective. Pure functions of the study's settings and the metrics."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from hypersack.grid.settings import Settings


def divergence(settings: Settings, metrics: Mapping[str, float],
               nonfinite: Collection[str]) -> str | None:
    """Why a trial diverged, or None: its objective (or a stop_if metric) was reported
    NaN or infinite, or a stop_if metric went past its bound."""
    watched = [*(o.metric for o in settings.goals), *settings.stop_if]
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
                      nonfinite: Iterable[str] = (), *, final: bool = True) -> str | None:
    """What to say of a trial that reported metrics without its objective, or None. A
    trial's end (`final`) must have every objective (the agent keeps each metric's last
    value); a report on the way, one of them at least (a program may report its latency
    only once it is measured)."""
    seen = set(metrics) | set(nonfinite)
    names = [o.metric for o in settings.goals]
    absent = [n for n in names if n not in seen]
    if not absent or (not final and len(absent) < len(names)):
        return None
    reported = ", ".join(sorted(metrics)[:12]) or "none"
    field = "objectives" if settings.multi_objective else "objective.metric"
    what = "objective metric" + ("s" if len(absent) > 1 else "")
    return (f"reported no {what} {', '.join(repr(n) for n in absent)} (it reported: "
            f"{reported}); check settings.{field}, or set settings.allow_missing_objective")


def stops_study(settings: Settings, metrics: Mapping[str, float],
                nonfinite: Iterable[str] = (), *, final: bool = False) -> str | None:
    """Why a trial's report stops its study: it reports metrics without its objective
    (see `missing_objective`), and the study does not allow that. None: it does not."""
    if settings.allow_missing_objective or not (metrics or tuple(nonfinite)):
        return None
    return missing_objective(settings, metrics, nonfinite, final=final)
