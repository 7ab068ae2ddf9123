"""The N-dimensional view of a study: one axis per hyperparameter, each point's state."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hypersack.core.types import TrialRecord, TrialState
from hypersack.grid.space import SearchSpace


@dataclass(frozen=True)
class GridView:
    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    states: dict[tuple[int, ...], TrialState]

    @classmethod
    def of(cls, space: SearchSpace, trials: Sequence[TrialRecord]) -> GridView:
        if space.search.type == "grid":
            axes = tuple((name, tuple(values)) for name, values in space.axes())
        else:
            axes = (("sample", tuple(range(len(trials)))),)
        return cls(axes=axes, states={t.coords: t.state for t in trials})

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(values) for _, values in self.axes)

    def state_at(self, **point: Any) -> TrialState:
        """The state of the trial at the given value of every axis."""
        coords = []
        for name, values in self.axes:
            if name not in point:
                raise KeyError(f"missing axis {name!r}")
            coords.append(values.index(point[name]))
        return self.states[tuple(coords)]

    def counts(self, **fixed: Any) -> Counter[TrialState]:
        """State counts over the points where each named axis has the given value."""
        wanted = {}
        for a, (name, values) in enumerate(self.axes):
            if name in fixed:
                wanted[a] = values.index(fixed[name])
        unknown = set(fixed) - {name for name, _ in self.axes}
        if unknown:
            raise KeyError(f"unknown axes {sorted(unknown)}")
        return Counter(s for c, s in self.states.items()
                       if all(c[a] == i for a, i in wanted.items()))

    def matrix(self, row_axis: str, col_axis: str) -> list[list[Counter[TrialState]]]:
        """A 2-D slice for a table: per (row value, column value), the state counts."""
        names = [name for name, _ in self.axes]
        r, c = names.index(row_axis), names.index(col_axis)
        rows: list[list[Counter[TrialState]]] = [
            [Counter() for _ in self.axes[c][1]] for _ in self.axes[r][1]
        ]
        for coords, state in self.states.items():
            rows[coords[r]][coords[c]][state] += 1
        return rows
