"""The CLI's server commands against an in-process server, and `hypersack run`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from hypersack._proto.v1 import hypersack_pb2 as pb
from hypersack.cli.main import main
from hypersack.server.app import HyperSackServer
from hypersack.store.sqlite import SqliteStore
from hypersack.testing.server import SLEEP_SPACE, RawAgent


def test_submit_status_results_nodes_drain_cancel(server: HyperSackServer,
                                                  tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    space = tmp_path / "tiny.yaml"
    space.write_text(SLEEP_SPACE)
    s = ["--server", server.address]
    agent = RawAgent(server.address)
    agent.register("n1")
    assert main(["submit", str(space), *s]) == 0
    assert "submitted tiny-1: 4 trials" in capsys.readouterr().out
    launches = agent.launches(4)
    for i, m in enumerate(launches[:3]):
        agent.send(pb.AgentMessage(exited=pb.TrialExited(trial_id=m.trial_id, exit_code=0,
                                                         metrics={"loss": 1.0 - i / 10})))
    from hypersack.cli.client import Client
    from hypersack.testing.server import wait as _wait

    with Client(server.address) as c:
        _wait(lambda: c.study("tiny-1").counts["COMPLETED"] == 3)
    assert main(["status", *s]) == 0
    assert "tiny-1" in capsys.readouterr().out
    assert main(["status", "tiny-1", *s]) == 0
    out = capsys.readouterr().out
    assert "completed 3" in out and "running 1" in out and "n1:0" in out
    assert main(["results", "tiny-1", "--format", "json", *s]) == 0
    data = json.loads(capsys.readouterr().out)
    objectives = [t["objective"] for t in data["trials"]]
    assert objectives[:3] == [0.8, 0.9, 1.0] and objectives[3] is None  # best first
    assert main(["results", "tiny-1", "--format", "csv", "--top", "2", *s]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["objective"] for r in rows] == ["0.8", "0.9"] and rows[0]["lr"]
    assert main(["nodes", *s]) == 0
    assert "n1" in capsys.readouterr().out
    assert main(["drain", "n1", *s]) == 0
    assert "draining" in capsys.readouterr().out
    assert main(["undrain", "n1", *s]) == 0
    assert "takes new trials again" in capsys.readouterr().out
    assert main(["undrain", "nosuch", *s]) == 2
    assert "no node 'nosuch'" in capsys.readouterr().err
    assert main(["logs", launches[3].trial_id, *s]) == 0
    assert "RUNNING" in capsys.readouterr().out
    assert main(["cancel", "tiny-1", *s]) == 0
    assert "CANCELLED" in capsys.readouterr().out
    assert main(["status", "nope", *s]) == 2
    assert "error: no study 'nope'" in capsys.readouterr().err
    agent.close()


def test_unreachable_server_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--server", "127.0.0.1:1"]) == 2
    assert "cannot reach the HyperSack server at 127.0.0.1:1" in capsys.readouterr().err


def test_run_fake_cluster_to_the_end(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    space = tmp_path / "s.yaml"
    space.write_text(SLEEP_SPACE.replace("{builtin: sleep}",
                                         "{builtin: sleep, options: {seconds_per_epoch: 0.3}}"))
    code = main(["run", str(space), "--backend", "fake", "--inventory", "2xA100-80GB",
                 "--state-dir", str(tmp_path / "st"), "--profiles",
                 str(Path(__file__).parents[2] / "examples" / "profiles-estimates.yaml")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "tiny-1: COMPLETED, completed 4" in out and "best first" in out
    # Read again later from the state directory, at 80 columns: ids are never cut.
    db = str(tmp_path / "st" / "run.db")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["results", "tiny-1", "--db", db, "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "tiny-1-t00000" in out or "tiny-1-t00001" in out
    assert "best 2 of 4" in out and max(len(line) for line in out.splitlines()) <= 80
    assert main(["status", "--db", db]) == 0
    assert "tiny-1" in capsys.readouterr().out
    assert main(["logs", "tiny-1-t00000", "--db", db]) == 0
    assert "COMPLETED" in capsys.readouterr().out
    assert main(["results", "tiny-9", "--db", db]) == 2


def test_run_on_cpu_profiles_once_then_remembers(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    space = tmp_path / "q.yaml"
    space.write_text("name: q\nmodels: [digits_mlp]\nhyperparameters: {batch_size: [256], "
                     "lr: [0.01, 0.03]}\nsettings: {epochs: 1}\n")
    state = tmp_path / "st"
    assert main(["run", str(space), "--backend", "cpu", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "q-1: COMPLETED, completed 2" in out and "profile jobs: 1 " in out
    store = SqliteStore(state / "run.db")
    (profile,) = store.list_profiles()
    store.close()
    assert profile.arch == "CPU" and profile.key.model == "digits_mlp"
    assert "measured on local (cpu" in profile.source and profile.iter_time_s > 0
    assert profile.iters_per_epoch == 6  # 1,437 training images / batch 256
    assert "numpy=" in profile.versions and "kernel=" in profile.versions
    assert profile.measured_at > 0 and profile.setup_s > 0
    assert main(["run", str(space), "--backend", "cpu", "--state-dir", str(state)]) == 0
    out = capsys.readouterr().out
    assert "q-2: COMPLETED, completed 2" in out and "profile jobs: 0 " in out
    store = SqliteStore(state / "run.db")
    (again,) = store.list_profiles()
    store.close()
    # Not profiled again: the measurement is the same one. Feedback from the trials that
    # ran may legitimately add observed peaks (and raise the demand), so compare only
    # what a new profile would change.
    measured = ("key", "arch", "iter_time_s", "iters_per_epoch", "setup_s", "measured_at",
                "source", "versions", "data_fraction", "eval_s_per_epoch")
    assert {f: getattr(again, f) for f in measured} == {f: getattr(profile, f) for f in measured}
    assert again.observed_trials >= profile.observed_trials


def test_profiles_list_export_import_and_observed_feedback(
        server: HyperSackServer, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    s = ["--server", server.address]
    assert main(["profiles", "--model", "resnet18", "--arch", "A100", "--format", "csv", *s]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    # Each batch size alone and fused 2, 4 and 8 wide.
    assert [(int(r["batch_size"]), int(r["fusion_width"])) for r in rows] == [
        (b, k) for b in (64, 128, 256, 512) for k in (1, 2, 4, 8)]
    assert rows[0]["source"] == "estimate" and rows[0]["memory_mib"] == "1500"
    out = tmp_path / "r18.yaml"
    assert main(["profiles", "export", str(out), "--model", "resnet18", "--arch", "A100",
                 *s]) == 0
    assert "exported 16 profiles" in capsys.readouterr().out
    out.write_text(out.read_text().replace("memory_mib: 1500,", "memory_mib: 1600,"))
    assert main(["profiles", "import", str(out), *s]) == 0
    assert "imported 0 profiles" in capsys.readouterr().out  # kept 16: the history wins
    assert main(["profiles", "import", str(out), "--replace", *s]) == 0
    assert "imported 16 profiles" in capsys.readouterr().out
    # A running trial that uses more memory than its profile corrects the history.
    agent = RawAgent(server.address)
    agent.register("n1")
    space = tmp_path / "tiny.yaml"
    space.write_text(SLEEP_SPACE.replace("batch_size: [64, 128]", "batch_size: [64]"))
    assert main(["submit", str(space), *s]) == 0
    launch = agent.launches(1)[0]
    assert launch.memory_mib == 1600
    agent.send(pb.AgentMessage(heartbeat=pb.Heartbeat(running=[pb.RunningTrial(
        trial_id=launch.trial_id, gpu_index=0, peak_memory_mib=2000,
        peak_utilization_pct=30.0)])))
    from hypersack.cli.client import Client
    from hypersack.testing.server import wait as _wait

    with Client(server.address) as c:
        _wait(lambda: c.profiles("resnet18", "A100")[0].observed_memory_mib == 2000)
    capsys.readouterr()
    assert main(["profiles", "--model", "resnet18", "--arch", "A100", "--format", "json",
                 *s]) == 0
    first = json.loads(capsys.readouterr().out)[0]
    assert first["demand"]["memory_mib"] == 2100 and "used 2000 MiB" in first["corrected"]
    assert main(["profiles", *s]) == 0
    table = capsys.readouterr().out
    assert "observed" in table and "2100" in table
    agent.close()
    bad = tmp_path / "bad.yaml"
    bad.write_text("profiles:\n- {model: resnet18, batch_size: 0, arch: A100}\n")
    assert main(["profiles", "import", str(bad), *s]) == 2
    assert "profiles.0" in capsys.readouterr().err
    assert main(["profiles", "export", *s]) == 2
    assert "profiles export: give a file" in capsys.readouterr().err


EVIL = "\x1b]0;owned\x07\x1b[2J\x9b31m\x7f"


def test_csv_and_json_results_carry_no_control_characters(
        server: HyperSackServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trial's metric names, log tail (its reason) and parameters are its own: what
    `results --format csv/json` prints of them holds no escape sequence (issue 35)."""
    import re

    space = tmp_path / "evil.yaml"
    space.write_text(SLEEP_SPACE.replace("name: tiny", "name: evil").replace("retries: 1",
                                                                             "retries: 0"))
    s = ["--server", server.address]
    agent = RawAgent(server.address)
    agent.register("n1")
    assert main(["submit", str(space), *s]) == 0, capsys.readouterr().err
    (first, *_) = agent.launches(4)
    agent.send(pb.AgentMessage(exited=pb.TrialExited(
        trial_id=first.trial_id, exit_code=0, attempt=first.attempt,
        log_tail=f"done {EVIL}", metrics={f"m{EVIL}": 1.0, "loss": 0.5})))
    from hypersack.cli.client import Client
    from hypersack.testing.server import wait as _wait

    with Client(server.address) as c:
        _wait(lambda: any(t.state == "COMPLETED" for t in c.trials("evil-1")))
    capsys.readouterr()
    control = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # \r\n ends CSV rows
    assert main(["results", "evil-1", "--format", "csv", *s]) == 0
    out = capsys.readouterr().out
    assert not control.search(out) and "\\x1b" in out
    rows = list(csv.DictReader(io.StringIO(out)))
    assert "metric.m\\x1b]0;owned\\x07\\x1b[2J\\x9b31m\\x7f" in rows[0]
    assert main(["results", "evil-1", "--format", "json", *s]) == 0
    out = capsys.readouterr().out
    assert not control.search(out)
    data = json.loads(out)
    assert f"metric.m{EVIL}" in data["trials"][0]  # the data itself, unchanged


def test_submit_of_an_adaptive_study_counts_every_trial(
        server: HyperSackServer, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 36: a 20-trial TPE study said "5 trials" (those asked so far)."""
    s = ["--server", server.address]
    assert main(["submit", str(Path(__file__).parents[2] / "examples" / "adaptive.yaml"),
                 *s]) == 0
    out = capsys.readouterr().out
    assert "submitted adaptive-1: 18 trials" in out and "asked of its sampler" in out


def test_a_plain_client_of_a_tls_server_is_told_to_pass_the_ca(tmp_path: Path) -> None:
    from hypersack.cli.client import Client
    from hypersack.core.errors import HyperSackError
    from hypersack.testing.server import start

    secured = start(tmp_path)
    try:
        with Client(secured.server.address, timeout_s=5) as c, \
                pytest.raises(HyperSackError, match="speaks TLS: pass --tls-ca"):
            c.studies()
    finally:
        secured.server.stop(0)
    with Client(secured.server.address, timeout_s=2) as c, \
            pytest.raises(HyperSackError, match="cannot reach"):  # nothing there now
        c.studies()


def test_table_values_have_six_significant_digits() -> None:
    from hypersack.cli.results import as_shown

    assert as_shown(0.0068327419871234567) == "0.00683274" and as_shown(64) == "64"
    assert as_shown("sgd") == "sgd" and as_shown(1e-05) == "1e-05"
