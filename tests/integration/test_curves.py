"""Learning curves and logs of real studies (issue 36, 5 and 6): every epoch a trial
reports is kept (also when it reports faster than its agent sends metrics), with where
each attempt ran; the results show the value and epoch reached; a pruned trial's log
comes back; the Python API gives the curves as DataFrames."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import hypersack
from hypersack.cli.offline import StoreReader
from hypersack.testing.cluster import Cluster

# 12 epochs in well under the agent's half second between metrics messages.
FAST = """
import sys
from hypersack.runner import sdk
lr = float(sys.argv[1])
for epoch in range(1, 13):
    sdk.iteration()
    sdk.report(step=epoch, loss=lr + 1.0 / epoch, acc=epoch / 12)
"""

# Slow enough for ASHA to stop the worst at its first rung while they run.
SLOW = """
import math, sys, time
from hypersack.runner import sdk
lr = float(sys.argv[1])
for epoch in range(1, 10):
    for _ in range(4):
        time.sleep(0.05)
        sdk.iteration(iters_per_epoch=4)
    loss = abs(math.log10(lr) + 2) + 1.0 / epoch
    sdk.report(step=epoch, loss=loss)
    print(f"epoch {epoch} loss {loss:.4f}", flush=True)
"""


def hypersack_cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hypersack.cli.main", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "COLUMNS": "160"})


def test_every_epoch_is_kept_with_the_spans_of_each_attempt(tmp_path: Path) -> None:
    (tmp_path / "fast.py").write_text(FAST)
    space = tmp_path / "space.yaml"
    space.write_text("""
name: fast
hyperparameters: {lr: [0.1, 0.2, 0.3]}
settings: {epochs: 12, objective: {metric: loss, mode: min}}
program: {command: "{python} {space_dir}/fast.py {lr}"}
""")
    state = tmp_path / "st"
    done = hypersack_cli("run", str(space), "--backend", "cpu", "--state-dir", str(state))
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    with StoreReader(state / "run.db") as reader:
        trials = reader.trials("fast-1")
        history = reader.history(study_id="fast-1")
    assert len(trials) == 3
    for t in trials:
        curve = sorted((h.step, dict(h.metrics)) for h in history.steps if h.trial_id == t.id)
        lr = json.loads(t.params_json)["lr"]
        assert [s for s, _ in curve] == list(range(1, 13)), curve  # not one missing
        for step, metrics in curve:
            assert abs(metrics["loss"] - (lr + 1.0 / step)) < 1e-9
            assert abs(metrics["acc"] - step / 12) < 1e-9
        assert t.epoch == 12 and t.has_last_value
    spans = list(history.spans)
    assert sorted(s.trial_id for s in spans) == sorted(t.id for t in trials)
    assert all(s.node == "local" and s.gpu_index == 0 and 0 < s.start <= s.end for s in spans)
    table = hypersack_cli("results", "fast-1", "--db", str(state / "run.db"),
                          "--format", "csv")
    rows = list(csv.DictReader(io.StringIO(table.stdout)))
    assert {r["epoch"] for r in rows} == {"12"}
    # The pictures of this real study: a curve per trial, a span per attempt.
    picture = tmp_path / "fast.svg"
    drawn = hypersack_cli("plot", "fast-1", "--db", str(state / "run.db"), "--out",
                          str(picture))
    assert drawn.returncode == 0, drawn.stderr[-2000:]
    found = {e.get("id", "") for e in ET.parse(picture).iter()}
    assert {i for i in found if i.startswith("curve:")} == {f"curve:{t.id}" for t in trials}
    assert {i for i in found if i.startswith("span:")} == {
        f"span:{s.trial_id}:{s.attempt}" for s in spans}
    # And into Optuna: every trial, with its curve as intermediate values.
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    exported = hypersack_cli("export", "fast-1", "--db", str(state / "run.db"),
                             "--optuna", url)
    assert exported.returncode == 0, exported.stderr[-2000:]
    import optuna

    theirs = optuna.load_study(study_name="fast-1", storage=url)
    assert [t.user_attrs["hypersack_trial"] for t in theirs.trials] == \
        sorted(t.id for t in trials)
    for t in theirs.trials:
        curve = {h.step: h.metrics["loss"] for h in history.steps
                 if h.trial_id == t.user_attrs["hypersack_trial"]}
        assert t.intermediate_values == curve and t.state.name == "COMPLETE"
        assert t.value == curve[12]


def test_curves_pruned_logs_and_the_python_api(cluster: Cluster) -> None:
    program = cluster.tmp / "slow.py"
    program.write_text(SLOW)
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@16")
    space = {"name": "asha", "workload": "slow",
             "hyperparameters": {"lr": [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0]},
             "pruner": {"type": "asha", "min_epochs": 1, "reduction_factor": 3,
                        "mode": "stop"},
             "program": {"command": f"{{python}} {program} {{lr}}"},
             "settings": {"epochs": 9, "objective": {"metric": "loss", "mode": "min"},
                          "demand": {"compute_pct": 10, "memory_mib": 100, "cores": 0.1,
                                     "epoch_s": 0.2}}}
    with hypersack.Client(cluster.address, cluster.admin_token,
                          tls_ca=cluster.certs / "ca.crt") as hs:
        study = hs.submit(space)
        final = hs.wait(study.id, timeout_s=180)
        results = hs.results(study.id)
        states = {t.id: t.state for t in results}
        assert final.state == "COMPLETED", [(t.id, t.state, t.reason) for t in results]
        pruned = [t for t in results if t.state == "PRUNED"]
        assert pruned, states  # the worst stopped at a rung
        for t in pruned:
            assert 1 <= t.epoch < 9 and t.last_value is not None
            log = hs.logs(t.id)  # the log of a trial the server stopped came back
            assert f"epoch {t.epoch} loss" in log, (t.id, log)
        best = results.best
        assert best is not None and best.epoch == 9
        frame = hs.history(best.id)
        assert list(frame["step"]) == list(range(1, 10))
        assert abs(frame["loss"].iloc[-1] - best.objective) < 1e-9
        curves = results.history()
        assert set(curves["trial"]) == set(states)
        assert {c for c in ("trial", "step", "at", "state", "loss")} <= set(curves.columns)
        by_trial = curves.groupby("trial")["step"].max().to_dict()
        assert all(by_trial[t.id] == t.epoch for t in results)
