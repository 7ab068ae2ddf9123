"""examples/own-program: a user's own training script (not a zoo model), end to end on a
secured server with two agents, through the Python API, and by `hypersack run`."""

from __future__ import annotations

from pathlib import Path

import pytest

import hypersack
from hypersack.cli.main import main
from hypersack.testing.cluster import Cluster
from tests.conftest import EXAMPLES

SPACE = EXAMPLES / "own-program" / "space.yaml"


def test_own_program_on_a_cluster_of_two_agents(cluster: Cluster) -> None:
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@16")
    cluster.start_agent("n2", "1xH100-80GB@16")
    with hypersack.Client(cluster.address, cluster.admin_token,
                          tls_ca=cluster.certs / "ca.crt") as hs:
        study = hs.submit(SPACE)
        final = hs.wait(study.id, timeout_s=150)
        assert final.state == "COMPLETED", [(t.id, t.state, t.reason) for t in
                                            hs.trials(study.id)]
        results = hs.results(study.id)
        assert len(results) == 6 and all(t.state == "COMPLETED" for t in results)
        assert all(t.objective is not None and "val_acc" in t.metrics for t in results)
        assert {t.node for t in results} <= {"n1", "n2"}
        assert not final.warnings
    with cluster.client() as c:
        profiles = c.profiles()
    # Its own workload, in its owner's namespace, one profile per width and
    # architecture, never a zoo model's.
    assert {p.key.model for p in profiles if p.source.startswith("measured")} == \
        {"admin:spiral-mlp"}
    widths = {(p.key.params, p.arch) for p in profiles if p.key.model == "admin:spiral-mlp"}
    assert {w for w, _ in widths} == {"width=16", "width=64"}


def test_own_program_by_hypersack_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    code = main(["run", str(SPACE), "--backend", "cpu", "--state-dir", str(tmp_path / "st")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "own-mlp-1: COMPLETED, completed 6" in out and "val_loss" in out
