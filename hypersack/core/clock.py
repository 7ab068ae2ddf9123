"""Time comes from an injected clock so that the core runs on real or virtual time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since an arbitrary epoch; never goes backwards."""
        ...


class SystemClock:
    """Wall-clock time (Unix seconds)."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to: the simulator's virtual time and the tests'."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now = start_s

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance by {seconds})")
        self._now += seconds

    def set(self, now_s: float) -> None:
        if now_s < self._now:
            raise ValueError(f"a clock cannot go backwards ({now_s} < {self._now})")
        self._now = now_s
