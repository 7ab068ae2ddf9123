"""The server's process for simulations (sim/process.py): calls run there in order,
a failing call fails alone, a dead worker fails its calls and is replaced, and a
shut-down one is gone."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil
import pytest

import hypersack
from hypersack.sim.process import SimProcess, WorkerDied
from hypersack.testing.server import RawAgent, make_server, wait


@pytest.fixture
def sims() -> SimProcess:
    pool = SimProcess()
    yield pool  # type: ignore[misc]
    pool.shutdown()


def test_calls_run_in_the_worker_in_order_and_a_failure_fails_only_its_call(
        sims: SimProcess) -> None:
    pid = sims.submit(os.getpid).result(timeout=60)
    assert pid != os.getpid() and pid == sims.pid
    calls = [sims.submit(divmod, n, 3) for n in range(5)]
    bad = sims.submit(int, "not a number")
    after = sims.submit(len, "abc")
    assert [c.result(timeout=60) for c in calls] == [divmod(n, 3) for n in range(5)]
    with pytest.raises(RuntimeError, match="ValueError: invalid literal"):
        bad.result(timeout=60)
    assert after.result(timeout=60) == 3 and sims.started == 1


def test_a_large_request_does_not_hold_the_caller_while_the_worker_is_busy(
        sims: SimProcess) -> None:
    busy = sims.submit(time.sleep, 60)
    began = time.monotonic()
    big = sims.submit(len, b"x" * 4_000_000)  # far past a pipe's buffer
    assert time.monotonic() - began < 30 and not busy.done() and not big.done()


def test_a_dead_worker_fails_its_calls_and_the_next_call_starts_another(
        sims: SimProcess) -> None:
    assert sims.submit(os.getpid).result(timeout=60) == sims.pid
    first = sims.pid
    stuck = sims.submit(time.sleep, 60)
    assert first is not None
    os.kill(first, 9)
    with pytest.raises(WorkerDied, match="ended"):
        stuck.result(timeout=60)
    second = sims.submit(os.getpid).result(timeout=60)
    assert second != first and sims.started == 2


def test_shutdown_kills_the_worker_at_once_and_refuses_later_calls() -> None:
    sims = SimProcess()
    busy = sims.submit(time.sleep, 60)
    pid = sims.pid  # started by the first call
    assert pid is not None
    sims.shutdown()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(WorkerDied):
        busy.result(timeout=60)
    with pytest.raises(RuntimeError, match="shut down"):
        sims.submit(os.getpid)


def test_a_stray_print_in_a_call_does_not_tear_its_reply(sims: SimProcess) -> None:
    assert sims.submit(print, "noise on stdout").result(timeout=60) is None
    assert sims.submit(len, "ok").result(timeout=60) == 2


def test_the_server_starts_it_for_the_first_study_under_predict_and_takes_its_choice(
        tmp_path: Path) -> None:
    """A real server: no simulation process until a study under `predict` arrives; its
    choice comes from that process (whether within the first decision's wait or at a
    later tick); the process is gone once the server stops."""
    server = make_server(tmp_path)
    try:
        assert server.sims.pid is None  # a server without such a study starts none
        agent = RawAgent(server.address)
        agent.register("n0", gpus=1)
        with hypersack.Client(server.address) as hs:
            study = hs.submit({
                "name": "bg", "models": ["resnet18"],
                "hyperparameters": {"batch_size": [64], "lr": [0.001, 0.01, 0.1]},
                "settings": {"epochs": 1, "retries": 0, "policy": "predict"},
                "program": {"builtin": "sleep"}})
        pid = server.sims.pid
        assert pid is not None and psutil.pid_exists(pid)
        agent.launches(1)
        orch = server.service.orch
        wait(lambda: orch.rule_choice(study.id) is not None, timeout_s=120)
        choice = orch.rule_choice(study.id)
        assert choice is not None and "simulated in" in choice.why, choice.why
        assert server.sims.started == 1
        agent.close()
    finally:
        server.stop(0)
    wait(lambda: not psutil.pid_exists(pid) or  # killed: gone once the signal lands
         psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)


def test_a_worker_that_cannot_start_fails_the_call_at_once(tmp_path: Path) -> None:
    sims = SimProcess(python=str(tmp_path / "no-python"))
    with pytest.raises(OSError):
        sims.submit(os.getpid)
    assert sims.pid is None
    sims.shutdown()


def test_a_call_past_the_limit_kills_the_worker_and_the_next_call_gets_another() -> None:
    sims = SimProcess(call_limit_s=1.0)
    try:
        assert sims.submit(os.getpid).result(timeout=60) == sims.pid
        stuck = sims.submit(time.sleep, 600)  # a wedged simulation
        with pytest.raises(WorkerDied):
            stuck.result(timeout=60)
        assert sims.submit(len, "ok").result(timeout=60) == 2 and sims.started == 2
    finally:
        sims.shutdown()
