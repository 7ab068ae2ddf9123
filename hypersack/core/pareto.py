"""The Pareto front of a multi-objective study: the trials no other trial beats on every
objective. Pure; used by the results (table, JSON, the Python API) and the export."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def objective_values(completed: bool, objective: float | None,
                     metrics: Mapping[str, float], names: Sequence[str]
                     ) -> list[float] | None:
    """A trial's value of every objective: its objective, then for a multi-objective
    study each other objective metric it ended with (`names`, the first being the
    objective's). None unless it completed with all of them finite. The one rule the
    sampler, the results and the export ask."""
    if not completed or objective is None:
        return None
    values = [objective, *(metrics.get(n) for n in names[1:])]
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    return [float(v) for v in values if v is not None]


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether `a` is at least as good as `b` on every objective and better on one (both
    already signed so that smaller is better)."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(
        x < y for x, y in zip(a, b, strict=True))


def front(points: Sequence[Sequence[float] | None], maximize: Sequence[bool]) -> list[int]:
    """The indices of the points on the Pareto front, in their order. None (a trial
    without every objective) is never on it; equal points are all on it. Sorted first,
    a point can be beaten only by one before it, and if any beats it a point of the front
    does: O(n log n + n x front)."""
    signs = [-1.0 if m else 1.0 for m in maximize]
    signed = [(tuple(s * v for s, v in zip(signs, p, strict=True)), i)
              for i, p in enumerate(points) if p is not None]
    signed.sort()
    kept: list[tuple[tuple[float, ...], int]] = []
    for values, i in signed:
        if not any(dominates(k, values) for k, _ in kept):
            kept.append((values, i))
    return sorted(i for _, i in kept)
