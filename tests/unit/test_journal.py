"""The journal: the one undo of the core's memory."""

from __future__ import annotations

from typing import Any

import pytest

from hypersack.orchestrator.journal import Journal, JournaledLog, journaled


class Box:
    """A mutable object the journal saves whole before it changes in place."""

    def __init__(self) -> None:
        self.items: list[int] = []

    def save(self) -> Any:
        return list(self.items)

    def restore(self, saved: Any) -> None:
        self.items = list(saved)


def test_a_rollback_undoes_dict_changes_in_reverse() -> None:
    j = Journal()
    d = journaled(j, [("a", 1), ("b", 2)])
    j.begin()
    d["a"] = 10
    d["c"] = 3
    del d["b"]
    d.pop("a")
    d.setdefault("e", 5)
    d.update({"f": 6})
    d.clear()
    j.rollback_to(0)
    assert d == {"a": 1, "b": 2}
    j.end()


def test_a_mark_undoes_only_what_came_after_it() -> None:
    j = Journal()
    d = journaled(j)
    box = Box()
    j.begin()
    d["kept"] = 1
    j.touch(box)
    box.items.append(1)
    mark = j.mark()
    d["undone"] = 2
    j.touch(box)
    box.items.append(2)
    j.touch(box)  # saved once per mark
    box.items.append(3)
    j.rollback_to(mark)
    assert d == {"kept": 1} and box.items == [1]
    j.end()
    assert d == {"kept": 1}


def test_changes_outside_an_open_journal_are_not_recorded() -> None:
    j = Journal()
    d = journaled(j)
    d["x"] = 1  # before begin: the state being built
    j.begin()
    j.rollback_to(0)
    assert d == {"x": 1}


def test_refused_mutators_say_so() -> None:
    d = journaled(Journal())
    with pytest.raises(TypeError):
        d.popitem()
    with pytest.raises(TypeError):
        d |= {"a": 1}


def test_every_registered_cache_is_invalidated_by_any_rollback() -> None:
    j = Journal()
    cache = {"k": 1}
    j.on_rollback(cache.clear)
    j.begin()
    j.end()
    assert cache == {"k": 1}  # a kept change invalidates nothing
    j.begin()
    j.rollback_to(j.mark())
    assert cache == {} and j.rollbacks == 1
    j.end()


def test_a_log_undoes_its_appends_and_their_counts() -> None:
    j = Journal()
    log: JournaledLog[float] = JournaledLog(j, maxlen=2, weight=lambda x: x)
    log.append(1.0)
    log.append(2.0)
    j.begin()
    log.append(4.0)  # pushes 1.0 out
    assert list(log) == [2.0, 4.0] and log.count == 3 and log.total == 7.0
    j.rollback_to(0)
    assert list(log) == [1.0, 2.0] and log.count == 2 and log.total == 3.0
    assert log[-1] == 2.0 and len(log) == 2
    j.end()


def test_an_ordered_dict_keeps_its_keys_in_value_order_through_changes_and_undo() -> None:
    """A study's pending trials in their order, kept as they come and go (a decision
    reads the first few of 20,000 without sorting them): after every change and after
    any undo, `ordered` is what sorting gives."""
    import random

    from hypersack.orchestrator.journal import OrderedJournaledDict

    rng = random.Random(3)
    j = Journal()
    d: OrderedJournaledDict[str] = OrderedJournaledDict(j)

    def check() -> None:
        assert d.ordered() == sorted((v, k) for k, v in d.items())

    for _ in range(40):
        j.begin()
        marks = [j.mark()]
        for _ in range(rng.randint(1, 30)):
            key = f"t{rng.randint(0, 25):02d}"
            op = rng.random()
            if op < 0.5:
                d[key] = rng.randint(-5, 40)
            elif op < 0.7:
                d.pop(key, None)
            elif op < 0.8 and key in d:
                del d[key]
            elif op < 0.85:
                d.setdefault(key, rng.randint(0, 9))
            elif op < 0.9:
                d.update({key: rng.randint(0, 9)})
            elif op < 0.92:
                d.clear()
            else:
                marks.append(j.mark())
            check()
        if rng.random() < 0.5:
            j.rollback_to(rng.choice(marks))  # an event's undo, or the batch's
            check()
            d["after"] = rng.randint(0, 9)  # changes after an undo keep the order too
            check()
        j.end()
