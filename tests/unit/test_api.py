"""The Python API (`hypersack.Client`) against a real server in-process: plain on
loopback, and secured with TLS and a token. A raw agent stream runs the trials."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import hypersack
from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.core.errors import NotFound, PermissionDenied
from hypersack.server.app import HyperSackServer
from hypersack.testing.server import RawAgent, make_server, start

SPACE = {
    "name": "api",
    "models": ["resnet18"],
    "hyperparameters": {"batch_size": [64], "lr": [0.001, 0.01, 0.1]},
    "settings": {"epochs": 1, "retries": 0, "objective": {"metric": "val_loss", "mode": "min"},
                 "oversubscription": {"A100": 3.0}},
    "program": {"builtin": "sleep"},
}


def run_trials(agent: RawAgent, losses: dict[float, float | None]) -> None:
    """Answer each launch: exit 0 with val_loss by lr (None: a failure)."""
    import json

    for _ in range(len(losses)):
        (launch,) = agent.launches(1)
        lr = json.loads(launch.params_json)["lr"]
        loss = losses[lr]
        agent.send(pb.AgentMessage(started=pb.TrialStarted(trial_id=launch.trial_id,
                                                           attempt=launch.attempt)))
        if loss is None:
            agent.send(pb.AgentMessage(exited=pb.TrialExited(
                trial_id=launch.trial_id, exit_code=3, log_tail="boom", attempt=launch.attempt)))
        else:
            agent.send(pb.AgentMessage(exited=pb.TrialExited(
                trial_id=launch.trial_id, exit_code=0, log_tail=f"lr {lr}",
                metrics={"val_loss": loss, "acc": 1 - loss}, attempt=launch.attempt)))


@pytest.fixture
def plain(tmp_path: Path) -> HyperSackServer:
    server = make_server(tmp_path)
    yield server  # type: ignore[misc]
    server.stop(0)


def test_submit_wait_and_results_best_first(plain: HyperSackServer, tmp_path: Path) -> None:
    agent = RawAgent(plain.address)
    agent.register("n1", gpus=3)
    worker = threading.Thread(target=run_trials,
                              args=(agent, {0.001: 0.5, 0.01: 0.2, 0.1: None}))
    worker.start()
    with hypersack.Client(plain.address) as hs:
        study = hs.submit(SPACE)
        assert study.id == "api-1" and sum(study.counts.values()) == 3
        seen = [s.state for s in hs.watch(study.id, 0.05)]
        assert seen[-1] == "COMPLETED"
        final = hs.wait(study.id, timeout_s=30)
        assert final.done and final.counts["FAILED"] == 1
        results = hs.results(study.id)
        assert [t.objective for t in results] == [0.2, 0.5, None]
        assert results.best is not None and results.best.params["lr"] == 0.01
        assert results[-1].state == "FAILED" and "exit code 3" in results[-1].reason
        assert hs.logs(results[0].id) == "lr 0.01"
        frame = results.to_dataframe()
        assert list(frame.index) == [t.id for t in results]
        assert frame.loc[results[0].id, "metric.acc"] == pytest.approx(0.8)
        assert frame.loc[results[0].id, "lr"] == 0.01
        # A YAML file works as well as a dict, and errors are HyperSack's own.
        path = tmp_path / "s.yaml"
        path.write_text("name: file\nmodels: [resnet18]\nhyperparameters: {batch_size: [64]}\n"
                        "program: {builtin: sleep}\n")
        assert hs.submit(path).name == "file"
        with pytest.raises(NotFound):
            hs.study("nope-1")
        assert hs.cancel("file-1").state == "CANCELLED"
    worker.join(10)
    agent.close()


def test_the_api_speaks_tls_with_a_token(tmp_path: Path) -> None:
    s = start(tmp_path)
    try:
        ca = s.certs / "ca.crt"
        with hypersack.Client(s.server.address, s.tokens["alice"], tls_ca=ca) as alice:
            study = alice.submit(SPACE)
            assert study.owner == "alice"
        with hypersack.Client(s.server.address, s.tokens["bob"], tls_ca=ca) as bob, \
                pytest.raises(PermissionDenied):
            bob.results(study.id)
    finally:
        s.server.stop(0)


def test_wait_and_tell_give_up_after_their_timeout(plain: HyperSackServer) -> None:
    with hypersack.Client(plain.address) as hs:
        study = hs.submit(SPACE)  # no agent: nothing runs
        with pytest.raises(TimeoutError, match=r"still ACTIVE after 0\.5 s"):
            hs.wait(study.id, timeout_s=0.5)
        assert hs.tell(study.id, timeout_s=0.3) == []
        hs.cancel(study.id)
        assert hs.wait(study.id, timeout_s=10).state == "CANCELLED"
        # Cancelled trials ended: tell returns them once.
        assert len(hs.tell(study.id, timeout_s=5)) == 3
        assert hs.tell(study.id, timeout_s=0.2) == []
