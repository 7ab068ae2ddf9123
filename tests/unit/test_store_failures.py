"""A store that fails (read-only or full disk) is the server's trouble, said as such:
writes answer UNAVAILABLE with the reason, health says NOT_SERVING, the agents' events
of the undone batches are applied again, and the server resumes by itself once the store
works. A submission the core refuses is answered with the core's reason."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.client import Client, domain_error
from hypersack.core.errors import InvalidInput, StoreUnavailable
from hypersack.core.types import TrialState
from hypersack.server.app import HyperSackServer
from hypersack.server.service import SchedulerService
from hypersack.server.servicers import status_of
from hypersack.testing.server import ONE_A100, first_launch, profiled_store, wait
from hypersack.testing.stores import FailingStore
from hypersack.wire.settings import ServerSettings

SPACE = """
name: tiny
models: [resnet18]
hyperparameters: {batch_size: [64], lr: [0.001, 0.01]}
settings: {epochs: 1, objective: {metric: loss, mode: min}, fusion: 'off'}
program: {builtin: sleep}
"""


def _until(what: Callable[[], object]) -> None:
    wait(what, 30.0)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[SchedulerService, FailingStore, list[str | None]]]:
    inner = profiled_store(tmp_path / "s.db")
    store = FailingStore(inner)
    svc = SchedulerService(store, tick_interval_s=0.05)
    states: list[str | None] = []
    svc.on_store = states.append
    svc.start()
    try:
        yield svc, store, states
    finally:
        svc.stop()
        inner.close()


def test_a_failing_store_is_unavailable_then_the_server_resumes(
        service: tuple[SchedulerService, FailingStore, list[str | None]]) -> None:
    svc, store, states = service
    store.fail_commits = 1
    with pytest.raises(StoreUnavailable, match=r"read-?only"):
        svc.submit(SPACE, "tiny.yaml")
    assert svc.orch.studies() == []  # undone whole
    assert states and states[0] is not None and svc.store_failure is not None
    _until(lambda: svc.store_failure is None)  # the next tick commits: serving again
    assert states[-1] is None
    assert svc.submit(SPACE, "tiny.yaml").id == "tiny-1"


def test_an_exit_in_a_batch_the_store_undid_is_applied_again(
        service: tuple[SchedulerService, FailingStore, list[str | None]]) -> None:
    svc, store, states = service
    session = svc.register(ONE_A100)
    study = svc.submit(SPACE, "tiny.yaml")
    launches = [m.launch for m in session.drain() if m is not None and m.HasField("launch")]
    assert len(launches) == 2
    first = launches[0]
    store.fail_commits = 1  # the exit's batch fails to commit, and is undone
    svc.agent_message(session, pb.AgentMessage(exited=pb.TrialExited(
        trial_id=first.trial_id, exit_code=0, attempt=first.attempt)))
    _until(lambda: svc.orch.trial(first.trial_id).state == TrialState.COMPLETED)
    assert store.failures == 1 and states[0] is not None and states[-1] is None
    assert svc.stats["failed_batches"] >= 1
    assert svc.orch.trial(first.trial_id).launches == 1  # counted once, never run again
    assert svc.orch.study(study.id).state.value == "ACTIVE"


def test_unavailable_is_its_own_status_and_the_client_says_the_database_failed() -> None:
    exc = StoreUnavailable("attempt to write a readonly database")
    assert status_of(exc) == grpc.StatusCode.UNAVAILABLE

    class Rpc(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.UNAVAILABLE

        def details(self) -> str:
            return str(exc)

    said = str(domain_error(Rpc(), "127.0.0.1:1"))
    assert "database is unavailable" in said and "is hypersack-server running" not in said


def test_a_submission_the_core_refuses_is_answered_with_its_reason(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The server cannot run the cmaes sampler (its package missing): the core refuses the
    # study when it is submitted, and the client reads why, not "see the server's log".
    monkeypatch.setitem(sys.modules, "cmaes", None)
    server = HyperSackServer(ServerSettings(listen="127.0.0.1:0", db=tmp_path / "s.db",
                                            tick_interval_s=0.1))
    server.start()
    try:
        client = Client(server.address)
        space = SPACE.replace("settings:", "search: {type: optuna, sampler: cmaes, trials: 4}\n"
                              "settings:")
        with pytest.raises(InvalidInput, match=r"search\.sampler cmaes: the server needs cmaes"):
            client.submit(space, "tiny.yaml")
        client.close()
    finally:
        server.stop(0)


def test_client_reads_wait_for_the_batch_in_progress(tmp_path: Path) -> None:
    """Reads take the service's lock: never a dictionary changing under them, nor a state
    that a refused event is rolling back."""
    import threading

    server = HyperSackServer(ServerSettings(listen="127.0.0.1:0", db=tmp_path / "s.db",
                                            tick_interval_s=0.1))
    server.start()
    try:
        client = Client(server.address)
        study = client.submit(SPACE, "tiny.yaml")
        got: list[object] = []
        reads = [lambda: client.trials(study.id), lambda: client.studies(),
                 lambda: client.study(study.id), lambda: client.nodes()]
        with server.service.locked():  # a batch in progress
            threads = [threading.Thread(target=lambda r=r: got.append(r())) for r in reads]
            for t in threads:
                t.start()
            time.sleep(0.3)
            assert got == []  # every read waits for the batch
        for t in threads:
            t.join(timeout=30)
        assert len(got) == len(reads)
        client.close()
    finally:
        server.stop(0)


def test_a_node_heard_in_a_batch_the_store_undid_was_still_heard() -> None:
    from hypersack.core.clock import ManualClock
    from hypersack.core.cluster import parse_shorthand
    from hypersack.orchestrator import Heartbeat, NodeJoined, Orchestrator, Tick
    from hypersack.store import MemoryStore

    clock = ManualClock(100.0)
    store = FailingStore(MemoryStore())
    orch = Orchestrator(store, clock)  # heartbeat timeout 30 s
    orch.handle(NodeJoined(parse_shorthand("1x1xA100-80GB@8").nodes[0]))
    clock.advance(25.0)
    store.fail_commits = 1
    with pytest.raises(StoreUnavailable):
        orch.handle(Heartbeat("node0"))
    clock.advance(10.0)  # 35 s after it joined, 10 s after it was last heard
    orch.handle(Tick())
    assert orch.has_node("node0")


class _BuggyStore(FailingStore):
    """Raises a plain error (not the store failing) on the next `bugs` trial updates
    (one trial's, or a batch's)."""

    bugs = 0

    def update_trial(self, trial: Any) -> None:
        if self.bugs:
            self.bugs -= 1
            raise RuntimeError("a bug, not a full disk")
        super().update_trial(trial)

    def update_trials(self, trials: Any) -> None:  # a batch's, as the book flushes them
        if self.bugs:
            self.bugs -= 1
            raise RuntimeError("a bug, not a full disk")
        super().update_trials(trials)


def test_a_batch_that_fails_for_itself_is_dropped_and_the_server_goes_on(
        tmp_path: Path) -> None:
    inner = profiled_store(tmp_path / "s.db")
    store = _BuggyStore(inner)
    svc = SchedulerService(store, tick_interval_s=0.05)
    svc.start()
    try:
        session = svc.register(ONE_A100)
        svc.submit(SPACE, "tiny.yaml")
        launch = first_launch(session)
        exit_msg = pb.AgentMessage(exited=pb.TrialExited(
            trial_id=launch.trial_id, exit_code=0, attempt=launch.attempt))
        store.bugs = 1
        svc.agent_message(session, exit_msg)
        _until(lambda: store.bugs == 0)
        time.sleep(0.2)
        assert svc.fatal is None and svc.store_failure is None  # still serving
        assert svc.orch.trial(launch.trial_id).state == TrialState.RUNNING  # undone whole
        svc.agent_message(session, exit_msg)  # the agent sends it again: it counts now
        _until(lambda: svc.orch.trial(launch.trial_id).state == TrialState.COMPLETED)
    finally:
        svc.stop()
        inner.close()
