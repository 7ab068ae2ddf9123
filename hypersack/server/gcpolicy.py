"""Python's cyclic garbage collector, kept off the path from an exit to the next launch.

A full collection walks every object the collector tracks and stops every thread (the
gRPC loop, the event worker) while it runs. Left automatic, it runs whenever the
objects that survived the young collections grew by a quarter: at a thousand nodes
(`scripts/bench_control_plane.py`, 50,000 trials), 15 of them in one study, 20 ms to
303 ms each as the trial records grew, and a relaunch that met one waited for it.

While a service runs, automatic full collections are off (the young generations are
still collected as before, at a cost that does not grow with the records), and one full
collection runs every `every_s` seconds from the ticker instead, with its time logged:
cycles that reached the old generation are still freed, a few minutes later. The
thresholds in force before are restored when the last service in the process stops.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("hypersack.server.service")

FULL_EVERY_S = 300.0
NEVER = 1 << 30  # young collections between two full ones: none comes automatically

_lock = threading.Lock()
_users = 0
_saved: tuple[int, int, int] | None = None


class FullCollections:
    """When the process's full collections run: every `every_s` seconds (`due_now`),
    not when the collector's own thresholds say."""

    def __init__(self, every_s: float = FULL_EVERY_S,
                 clock: Callable[[], float] = time.monotonic,
                 on_gc: Callable[[str, dict[str, int]], None] | None = None) -> None:
        self.every_s = every_s
        self._clock = clock
        self._on_gc = on_gc  # a gc.callbacks hook while started (the pauses' timing)
        self._last = clock()
        self._started = False
        self.runs = 0
        self.freed = 0  # objects the scheduled collections freed, all together

    def start(self) -> None:
        global _users, _saved
        if self._started:
            return
        self._started = True
        self._last = self._clock()
        with _lock:
            if _users == 0:
                _saved = gc.get_threshold()
                young, middle = _saved[0], _saved[1]
                gc.set_threshold(young, middle, NEVER)
            _users += 1
        if self._on_gc is not None:
            gc.callbacks.append(self._on_gc)

    def stop(self) -> None:
        global _users, _saved
        if not self._started:
            return
        self._started = False
        if self._on_gc is not None and self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        with _lock:
            _users -= 1
            if _users == 0 and _saved is not None:
                gc.set_threshold(*_saved)
                _saved = None

    def due_now(self) -> bool:
        """Run a full collection if `every_s` passed since the last; True if it ran."""
        now = self._clock()
        if not self._started or now - self._last < self.every_s:
            return False
        began = time.perf_counter()
        freed = gc.collect()
        self._last = self._clock()
        self.runs += 1
        self.freed += freed
        log.info("full garbage collection: %d objects freed in %.1f ms", freed,
                 1000 * (time.perf_counter() - began))
        return True
