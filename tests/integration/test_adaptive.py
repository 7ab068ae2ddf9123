"""Adaptive search and early stopping with real processes: the example by `hypersack
run` (real training, checkpoints and resumes), and a server killed in the middle of an
Optuna + ASHA study."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hypersack.cli.main import main
from hypersack.testing.cluster import Cluster, wait_for
from tests.conftest import EXAMPLES

SPACE = EXAMPLES / "adaptive.yaml"


def test_adaptive_example_by_hypersack_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                           ) -> None:
    state = tmp_path / "st"
    code = main(["run", str(SPACE), "--backend", "cpu", "--state-dir", str(state)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "adaptive-1: COMPLETED" in out and "pruned" in out
    logs = {p: p.read_text() for p in (state / "work").rglob("log.txt")}
    # Trials paused at a rung with a checkpoint, and the promoted ones resumed from it.
    assert any("checkpoint saved" in text for text in logs.values())
    resumed = [p for p, text in logs.items() if "resumed from" in text]
    assert resumed and all(p.parent.name != "attempt-1" for p in resumed)
    # The completed trial keeps its checkpoint (its final weights); pruned trials' go as
    # they are pruned (the last ones may still be going when the run ends).
    db = json.loads(main_json(state, "adaptive-1"))["trials"]
    folders = {t["trial"]: next((state / "work").rglob(f"{t['trial']}/checkpoint"), None)
               for t in db}
    done = [t["trial"] for t in db if t["state"] == "COMPLETED"]
    assert done and all(folders[t] is not None for t in done)
    pruned = [t["trial"] for t in db if t["state"] == "PRUNED"]
    assert sum(folders[t] is None for t in pruned) >= len(pruned) // 2, folders


def main_json(state: Path, study: str) -> str:
    """`hypersack results STUDY --format json` on the run's database."""
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["results", study, "--format", "json", "--db",
                     str(state / "run.db")]) == 0
    return out.getvalue()


ADAPTIVE = """
name: adaptive-restart
models: [resnet18]
hyperparameters:
  batch_size: [64]
  lr: {distribution: loguniform, low: 1.0e-4, high: 1.0}
search: {type: optuna, sampler: tpe, trials: 12, seed: 7}
pruner: {type: asha, min_epochs: 1, reduction_factor: 3}
settings: {epochs: 9, retries: 2, oversubscription: {A100: 1.0}}
program: {builtin: sleep, options: {seconds_per_epoch: 0.6, iters_per_epoch: 2}}
"""


# A restart shorter than the agent's fence (half the heartbeat timeout): its trials keep
# running through it.
RESTART_FLAGS = ("--heartbeat-timeout-s", "20")


def test_server_killed_mid_optuna_asha_study_finishes_it_once(cluster: Cluster) -> None:
    cluster.start_server(*RESTART_FLAGS)
    cluster.start_agent("n1", "1xA100-80GB@16")
    with cluster.client() as c:
        study = str(c.submit(ADAPTIVE, "adaptive.yaml").id)

    def trials() -> list:  # type: ignore[type-arg]
        with cluster.client() as c:
            return c.trials(study)

    def mid_study() -> bool:
        ts = trials()
        return any(t.state in ("PAUSED", "PRUNED") for t in ts) and len(ts) < 12

    wait_for("trials ranked at a rung, and more to ask", mid_study, 90, 0.1)
    before = {t.id: json.loads(t.params_json) for t in trials()}
    cluster.kill_server()
    time.sleep(1.0)  # the agent keeps its trials running meanwhile
    cluster.start_server(*RESTART_FLAGS)

    def state() -> str:
        with cluster.client() as c:
            return str(c.study(study).state)

    wait_for("the study to end", lambda: state() != "ACTIVE", 150, 0.3)
    final = trials()
    assert state() == "COMPLETED"
    # Every trial the search asked for, numbered in turn, each ended once: completed or
    # pruned; the ones asked before the restart kept their parameters.
    assert sorted(t.id for t in final) == [f"{study}-t{i:05d}" for i in range(12)]
    assert {t.state for t in final} <= {"COMPLETED", "PRUNED"}, \
        [(t.id, t.state, t.reason) for t in final]
    assert all(json.loads(t.params_json) == before[t.id] for t in final if t.id in before)
    # No attempt more than its segments (one per rung passed, plus the first): nothing
    # started twice after the restart.
    for t in final:
        assert t.launches <= 3, (t.id, t.launches, t.reason)
    assert any(t.state == "COMPLETED" for t in final)


MANUAL = {
    "name": "mine", "models": ["resnet18"],
    "hyperparameters": {"batch_size": [64],
                        "lr": {"distribution": "loguniform", "low": 1.0e-4, "high": 1.0}},
    "search": {"type": "manual", "trials": 4},
    "settings": {"epochs": 2},
    "program": {"builtin": "sleep", "options": {"seconds_per_epoch": 0.3}},
}


def test_own_optimizer_asks_and_is_told_through_the_python_api(cluster: Cluster) -> None:
    import hypersack
    from hypersack.core.errors import InvalidInput

    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@16")
    with hypersack.Client(cluster.address, cluster.admin_token,
                          tls_ca=cluster.certs / "ca.crt") as hs:
        study = hs.submit(MANUAL)
        with pytest.raises(InvalidInput, match="outside"):
            hs.ask(study.id, {"batch_size": 64, "lr": 5.0})
        assert hs.tell(study.id, timeout_s=0.5) == []  # nothing asked: nothing ends
        proposals = [{"batch_size": 64, "lr": lr} for lr in (0.001, 0.1)]
        asked = hs.ask(study.id, proposals)
        assert [t.params["lr"] for t in asked] == [0.001, 0.1]
        told = []
        while len(told) < 2:
            told += hs.tell(study.id, timeout_s=60)
        assert {t.id for t in told} == {t.id for t in asked}
        assert all(t.state == "COMPLETED" and t.objective is not None for t in told)
        # The optimizer's next proposal: better where the loss was lower.
        best = min(told, key=lambda t: t.objective or 0.0)
        hs.ask(study.id, [{"batch_size": 64, "lr": best.params["lr"] * f}
                          for f in (0.5, 2.0)])
        final = hs.wait(study.id, timeout_s=60)
        assert final.state == "COMPLETED" and final.counts.get("COMPLETED") == 4
        assert len(hs.tell(study.id, timeout_s=5)) == 2  # the two told only now
        with pytest.raises(InvalidInput):
            hs.ask(study.id, {"batch_size": 64, "lr": 0.01})  # the study has ended
