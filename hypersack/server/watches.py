"""The clients' watches of their studies: a snapshot each time a batch changed
something (at most one per interval the client asks for), on a bounded number of open
streams, each freed within a second of its client going away.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hypersack.core.bounds import clamp
from hypersack.core.errors import Overloaded
from hypersack.core.types import StudyRecord

MAX_WATCH_INTERVAL_S = 60.0


@dataclass(frozen=True)
class Snapshot:
    study: StudyRecord
    counts: dict[str, int]
    gpus: list[tuple[str, int, int, float]]


class Watches:
    def __init__(self, lock: threading.RLock, snapshot: Callable[[str], Snapshot],
                 stopped: threading.Event, max_watches: int) -> None:
        self._lock = lock  # the service's
        self._changed = threading.Condition(lock)
        self._version = 0  # batches applied so far
        self._snapshot = snapshot
        self._stopped = stopped
        self.max_watches = max_watches
        self.max_watches_per_client = max(1, max_watches // 4)
        self._open: dict[str, int] = {}

    def changed(self) -> None:
        """A batch changed the state: every watch takes a new snapshot."""
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def wake(self) -> None:
        """Wake every waiting watch (one of their clients went away)."""
        with self._changed:
            self._changed.notify_all()

    def watch(self, study_id: str, min_interval_s: float, active: Callable[[], bool]
              ) -> Iterator[Snapshot]:
        """Snapshots of a study as it changes, ending once it is terminal or the client
        is gone. The interval is clamped to [0, 60] s and waited for in steps of at most
        a second, so a cancelled watch never holds its thread for long."""
        interval = clamp(min_interval_s, 0.0, MAX_WATCH_INTERVAL_S, 1.0)
        self._snapshot(study_id)  # NotFound before the stream starts
        seen = -1
        while active() and not self._stopped.is_set():
            with self._changed:
                if self._version == seen:
                    self._changed.wait(timeout=1.0)
                if self._version == seen:
                    continue
                seen = self._version
                snap = self._snapshot(study_id)
            yield snap
            if snap.study.state.value != "ACTIVE":
                return
            deadline = time.monotonic() + interval
            while active() and not self._stopped.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with self._changed:  # woken early by wake() when the client goes away
                    self._changed.wait(min(left, 0.5))

    def watching(self) -> int:
        """How many watches are open."""
        with self._lock:
            return sum(self._open.values())

    @contextmanager
    def slot(self, client: str) -> Iterator[None]:
        """Hold one of the bounded watch slots: at most `max_watches` in all and
        `max_watches_per_client` per holder (a user; a client host without
        authentication); past that, Overloaded."""
        with self._lock:
            total = self.watching()
            mine = self._open.get(client, 0)
            if total >= self.max_watches or mine >= self.max_watches_per_client:
                raise Overloaded(f"too many watches open ({total} in all, {mine} of {client}); "
                                 "close one or poll with hypersack status")
            self._open[client] = mine + 1
        try:
            yield
        finally:
            with self._lock:
                self._open[client] -= 1
                if not self._open[client]:
                    del self._open[client]
