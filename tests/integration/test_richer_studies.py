"""Richer studies on a real server and agent (issue 36, 8): a multi-objective TPE study
of a user's own program ends with its Pareto front in the results, and `hypersack
extend` adds trials to it once it ended; its sampler goes on, and only its owner may."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import hypersack
from hypersack.core.errors import PermissionDenied
from hypersack.testing.cluster import Cluster

# Two objectives that pull apart: a wider model is more accurate and slower.
PROGRAM = """
import sys
from hypersack.runner import sdk
width = int(sys.argv[1])
for epoch in (1, 2):
    sdk.iteration()
    sdk.report(step=epoch, error=1.0 / width + 0.01 * (2 - epoch))
sdk.report(step=2, error=1.0 / width, latency_ms=0.5 * width)
"""


def test_a_multi_objective_study_ends_with_its_front_and_grows(cluster: Cluster) -> None:
    program = cluster.tmp / "two.py"
    program.write_text(PROGRAM)
    bob = cluster.add_user("bob", "user")  # before the server starts
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@16")
    space = {"name": "two", "workload": "two",
             "hyperparameters": {"width": {"distribution": "int", "low": 1, "high": 64}},
             "search": {"type": "optuna", "sampler": "tpe", "trials": 4, "seed": 3},
             "program": {"command": f"{{python}} {program} {{width}}"},
             "settings": {"epochs": 2,
                          "objectives": [{"metric": "error", "mode": "min"},
                                         {"metric": "latency_ms", "mode": "min"}],
                          "demand": {"compute_pct": 10, "memory_mib": 100, "cores": 0.1,
                                     "epoch_s": 0.2}}}
    with hypersack.Client(cluster.address, cluster.admin_token,
                          tls_ca=cluster.certs / "ca.crt") as hs:
        study = hs.submit(space)
        assert hs.wait(study.id, timeout_s=120).state == "COMPLETED"
        results = hs.results(study.id)
        assert results.study.objectives == (("error", "min"), ("latency_ms", "min"))
        assert len(results) == 4 and all(t.state == "COMPLETED" for t in results)
        # Every distinct width trades error for latency: all of them are on the front.
        widths = {t.params["width"] for t in results}
        assert {t.params["width"] for t in results.pareto_front()} == widths
        for t in results:
            assert t.values == (pytest.approx(1.0 / t.params["width"]),
                                pytest.approx(0.5 * t.params["width"]))

        with hypersack.Client(cluster.address, bob, tls_ca=cluster.certs / "ca.crt") as b, \
                pytest.raises(PermissionDenied):
            b.extend(study.id, 2)

    env = {**os.environ, "HYPERSACK_TOKEN": cluster.admin_token, "COLUMNS": "160"}
    done = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "extend", study.id,
                           "--trials", "3", "--watch", *cluster.cli_flags()],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    assert f"{study.id}: ACTIVE, 7 trials in all" in done.stdout
    shown = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "results", study.id,
                            "--format", "json", *cluster.cli_flags()],
                           capture_output=True, text=True, timeout=60, env=env)
    data = json.loads(shown.stdout)
    assert data["state"] == "COMPLETED" and len(data["trials"]) == 7
    assert all(t["state"] == "COMPLETED" and len(t["values"]) == 2 for t in data["trials"])
    assert any(t["pareto"] for t in data["trials"])
    refused = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "extend", study.id,
                              "--trials", "0", *cluster.cli_flags()],
                             capture_output=True, text=True, timeout=60, env=env)
    assert refused.returncode != 0 and "extend by 1" in refused.stderr, refused.stderr
