"""An undo log over the orchestrator's memory, so that an event whose handling raises
changes nothing: the store rolls back its savepoint, the journal rolls back memory.

Dictionaries are `JournaledDict`s that record the old value of every key they change
while the journal is open; mutable objects (a node's allocation) are saved whole the
first time they are touched after a mark; a `JournaledLog` records its appends. Rolling
back to a mark replays the records backwards. The cost is proportional to what an event
changed, never to the state's size.

Everything else the core keeps is a cache, and a cache registers with `on_rollback` how it
is invalidated: after any rollback, every registered invalidation runs, so no cache can
outlive the state it was computed from (a trial id that an undone submission handed out
comes back with other parameters; a study id with another space).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")

_MISSING: Any = object()


class Restorable(Protocol):
    def save(self) -> Any: ...

    def restore(self, saved: Any) -> None: ...


class Journal:
    def __init__(self) -> None:
        self._entries: list[tuple[Any, Any, Any]] = []
        self._touched: set[int] = set()
        self._invalidations: list[Callable[[], None]] = []
        self.open = False
        self.rollbacks = 0  # how many rollbacks ran (for tests and logs)

    def on_rollback(self, invalidate: Callable[[], None]) -> None:
        """Register a cache's invalidation: it runs after every rollback."""
        self._invalidations.append(invalidate)

    def begin(self) -> None:
        self._entries.clear()
        self._touched.clear()
        self.open = True

    def end(self) -> None:
        """Keep every change made since begin()."""
        self._entries.clear()
        self._touched.clear()
        self.open = False

    def mark(self) -> int:
        """A point to roll back to; objects are saved afresh after it."""
        self._touched.clear()
        return len(self._entries)

    def rollback_to(self, mark: int) -> None:
        while len(self._entries) > mark:
            target, key, old = self._entries.pop()
            if isinstance(target, JournaledDict):
                if old is _MISSING:
                    dict.pop(target, key, None)
                else:
                    dict.__setitem__(target, key, old)
            else:
                target.restore(old)
        self._touched.clear()
        self.rollbacks += 1
        for invalidate in self._invalidations:
            invalidate()

    def record(self, target: Any, key: Any, old: Any) -> None:
        self._entries.append((target, key, old))

    def touch(self, obj: Restorable) -> None:
        """Call before changing `obj` in place."""
        if self.open and id(obj) not in self._touched:
            self._touched.add(id(obj))
            self._entries.append((obj, None, obj.save()))


class JournaledDict(dict[K, V]):
    """A dict whose changes the journal can undo. Only the mutating methods the
    orchestrator uses are journaled; the others are refused."""

    def __init__(self, journal: Journal) -> None:
        super().__init__()
        self._journal = journal

    def _record(self, key: K) -> None:
        if self._journal.open:
            self._journal.record(self, key, dict.get(self, key, _MISSING))

    def __setitem__(self, key: K, value: V) -> None:
        self._record(key)
        dict.__setitem__(self, key, value)

    def __delitem__(self, key: K) -> None:
        self._record(key)
        dict.__delitem__(self, key)

    def pop(self, key: K, *default: Any) -> Any:
        if key in self:
            self._record(key)
        return dict.pop(self, key, *default)

    def setdefault(self, key: K, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return dict.__getitem__(self, key)

    def clear(self) -> None:
        for key in list(self):
            self._record(key)
        dict.clear(self)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def _refused(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("not journaled")

    popitem: Callable[..., Any] = _refused
    __ior__: Callable[..., Any] = _refused


class OrderedJournaledDict(JournaledDict[K, int]):
    """A journaled dict that also keeps its keys in order of their values (then keys), as
    they change: a decision reads the first few of a study's 20,000 pending trials
    without sorting them all (`ordered`). After an undo, which writes past the methods
    below, the order is built again when next asked for."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(journal)
        self._order: list[tuple[int, K]] | None = []
        journal.on_rollback(self._forget)

    def _forget(self) -> None:
        self._order = None

    def _remove(self, value: int, key: K) -> None:
        if self._order is not None:
            i = bisect.bisect_left(self._order, (value, key))
            del self._order[i]

    def __setitem__(self, key: K, value: int) -> None:
        old = dict.get(self, key, _MISSING)
        super().__setitem__(key, value)
        if old is not _MISSING:
            self._remove(old, key)
        if self._order is not None:
            bisect.insort(self._order, (value, key))

    def __delitem__(self, key: K) -> None:
        old = dict.__getitem__(self, key)
        super().__delitem__(key)
        self._remove(old, key)

    def pop(self, key: K, *default: Any) -> Any:
        if key not in self:
            return dict.pop(self, key, *default)
        value = dict.__getitem__(self, key)
        del self[key]
        return value

    def clear(self) -> None:
        super().clear()
        self._order = []

    def ordered(self) -> list[tuple[int, K]]:
        """(value, key) in order; the caller reads it, and copies it to keep it."""
        if self._order is None:
            self._order = sorted((v, k) for k, v in self.items())
        return self._order


def journaled(journal: Journal, items: Iterable[tuple[K, V]] = ()) -> JournaledDict[K, V]:
    d: JournaledDict[K, V] = JournaledDict(journal)
    for k, v in items:
        dict.__setitem__(d, k, v)
    return d


class JournaledLog(Generic[T]):
    """The latest `maxlen` entries of an append-only log, with how many were ever added
    and the sum of a number over them; the journal undoes appends (a decision that was
    undone is neither kept nor counted)."""

    def __init__(self, journal: Journal, maxlen: int,
                 weight: Callable[[T], float] = lambda _: 0.0) -> None:
        self._journal = journal
        self._recent: deque[T] = deque(maxlen=max(1, maxlen))
        self._weight = weight
        self.count = 0
        self.total = 0.0

    def append(self, entry: T) -> None:
        full = len(self._recent) == self._recent.maxlen
        dropped = self._recent[0] if full else _MISSING
        if self._journal.open:
            self._journal.record(self, None, dropped)
        self._recent.append(entry)
        self.count += 1
        self.total += self._weight(entry)

    def restore(self, dropped: Any) -> None:
        """Undo the last append (`dropped`: the oldest entry it pushed out, if any)."""
        entry = self._recent.pop()
        if dropped is not _MISSING:
            self._recent.appendleft(dropped)
        self.count -= 1
        self.total -= self._weight(entry)

    def __iter__(self) -> Iterator[T]:
        return iter(self._recent)

    def __len__(self) -> int:
        return len(self._recent)

    def __getitem__(self, i: int) -> T:
        return self._recent[i]
