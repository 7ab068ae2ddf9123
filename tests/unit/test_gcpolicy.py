"""The server's full garbage collections run on its own schedule (issue 37, 3): at a
thousand nodes the collector's automatic ones stopped every thread for 20-303 ms, 15
times in one study, and relaunches waited behind them."""

from __future__ import annotations

import gc
from pathlib import Path

from hypersack.core.clock import ManualClock
from hypersack.server import gcpolicy
from hypersack.server.gcpolicy import NEVER, FullCollections
from hypersack.server.metrics import LatencyHistograms
from hypersack.server.service import SchedulerService
from hypersack.testing.server import profiled_store


def test_automatic_full_collections_are_off_while_a_service_runs_then_restored() -> None:
    before = gc.get_threshold()
    a, b = FullCollections(), FullCollections()
    a.start()
    b.start()
    try:
        assert gc.get_threshold() == (before[0], before[1], NEVER)  # young ones as before
        a.stop()
        a.stop()  # stopping twice is stopping once
        assert gc.get_threshold()[2] == NEVER  # b still runs
    finally:
        b.stop()
    assert gc.get_threshold() == before
    assert gcpolicy._users == 0


def test_a_full_collection_runs_every_interval_and_frees_cycles() -> None:
    clock = ManualClock(100.0)
    full = FullCollections(every_s=300.0, clock=clock.now)
    seen: list[int] = []

    def hook(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] == 2:
            seen.append(info["collected"])

    assert not full.due_now()  # not started: the collector's own schedule
    full.start()
    gc.callbacks.append(hook)
    try:
        cycle: list[object] = []
        cycle.append(cycle)
        del cycle
        clock.advance(299.0)
        assert not full.due_now() and seen == []
        clock.advance(1.0)
        assert full.due_now() and full.runs == 1
        assert len(seen) == 1 and seen[0] >= 1  # the cycle was freed
        assert full.freed == seen[0]
        assert not full.due_now()  # the next one, an interval later
        clock.advance(300.0)
        assert full.due_now() and full.runs == 2
    finally:
        gc.callbacks.remove(hook)
        full.stop()


def test_the_service_times_full_collections_for_metrics(tmp_path: Path) -> None:
    h = LatencyHistograms()
    h.on_gc("start", {"generation": 1})
    h.on_gc("stop", {"generation": 1})
    assert list(h.gc_pauses) == []  # young ones are not the pauses that matter
    h.on_gc("start", {"generation": 2})
    h.on_gc("stop", {"generation": 2})
    assert len(h.gc_pauses) == 1 and h.gc_pauses[0] >= 0
    names = {m.name for m in h.collect()}
    assert "hypersack_gc_pause_seconds" in names
    store = profiled_store(tmp_path / "s.db")
    svc = SchedulerService(store, tick_interval_s=0.05)
    before = gc.get_threshold()
    svc.start()
    try:
        assert gc.get_threshold()[2] == NEVER
        gc.collect()  # a full collection while the service runs: timed for /metrics
        assert len(svc.histograms.gc_pauses) >= 1
    finally:
        svc.stop()
        store.close()
    assert gc.get_threshold() == before
    assert svc.histograms.on_gc not in gc.callbacks  # the hook goes with the service
