"""Least privilege on GPU nodes, with a real server and agents as processes: what an
agent refuses to run, and what a trial can see of the agent's environment."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

from hypersack.testing.cluster import Cluster, space_yaml
from hypersack.testing.cluster import done as _done
from hypersack.testing.cluster import submit as _submit

ENV_PRINTER = """
import os, sys
for name in sorted(os.environ):
    print(f"ENV {name}={os.environ[name]}")
print("lr", sys.argv[1])
"""


def _one_trial(cluster: Cluster, name: str, program: str) -> object:
    study = _submit(cluster, space_yaml(name, models="[resnet18]", batch_sizes="[64]",
                                        lrs="[0.001]", retries=0, program=program))
    (trial,) = _done(cluster, study, 60)
    return trial


def test_an_agent_runs_built_in_programs_only_unless_allowed(cluster: Cluster,
                                                             tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("print('ran')\n")
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@48", "--no-commands")
    trial = _one_trial(cluster, "nocmd", f"{{command: '{{python}} {script}'}}")
    assert trial.state == "FAILED"  # type: ignore[attr-defined]
    assert "runs built-in programs only" in trial.log_tail  # type: ignore[attr-defined]
    assert "ran" not in trial.log_tail  # type: ignore[attr-defined]


def test_shells_and_inline_code_are_refused_unless_allowed(cluster: Cluster) -> None:
    cluster.start_server()
    cluster.start_agent("n1")  # commands allowed, shells not
    marker = cluster.tmp / "pwned"
    shell = f"{{command: \"sh -c 'touch {marker}; echo {{lr}}'\"}}"
    trial = _one_trial(cluster, "shell", shell)
    assert trial.state == "FAILED" and "sh is a shell" in trial.log_tail  # type: ignore[attr-defined]
    inline = f"{{command: \"{{python}} -c 'open(\\\"{marker}\\\", \\\"w\\\")'\"}}"
    trial = _one_trial(cluster, "inline", inline)
    assert trial.state == "FAILED" and "inline code" in trial.log_tail  # type: ignore[attr-defined]
    assert not marker.exists()


def test_a_trial_sees_none_of_the_agents_undeclared_variables(cluster: Cluster,
                                                               tmp_path: Path) -> None:
    script = tmp_path / "env.py"
    script.write_text(ENV_PRINTER)
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@48", "--allow-commands", "python",
                        "--pass-env", "SHARED_*",
                        env={"AWS_SECRET_ACCESS_KEY": "topsecret", "SHARED_CACHE": "/c",
                             "LD_PRELOAD": "", "LANG": "C.UTF-8"})
    trial = _one_trial(cluster, "env", f"{{command: '{{python}} {script} {{lr}}'}}")
    tail = trial.log_tail  # type: ignore[attr-defined]
    assert trial.state == "COMPLETED" and "lr 0.001" in tail  # type: ignore[attr-defined]
    seen = {line[4:].split("=", 1)[0] for line in tail.splitlines() if line.startswith("ENV ")}
    assert "AWS_SECRET_ACCESS_KEY" not in seen and "topsecret" not in tail
    assert "LD_PRELOAD" not in seen and "PYTHONUNBUFFERED" not in seen
    assert {"SHARED_CACHE", "PATH", "LANG", "HYPERSACK_TRIAL_ID"} <= seen


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching users needs root")


@needs_root
def test_a_root_agent_refuses_to_run_trials_as_root_unless_told(cluster: Cluster) -> None:
    cluster.start_server()
    agent = subprocess.run(
        [sys.executable, "-m", "hypersack.agent.app", "--server", cluster.agent_address,
         "--node", "n1", "--backend", "fake", "--workdir", str(cluster.tmp / "w"),
         *cluster.tls_flags_for_agent("n1")],
        capture_output=True, text=True, timeout=60)
    assert agent.returncode == 2 and "--run-as" in agent.stderr
    assert agent.stderr.count("\n") == 1
    assert not (cluster.tmp / "w").exists()


@needs_root
def test_a_root_agent_runs_trials_as_the_mapped_user(cluster: Cluster) -> None:
    nobody = pwd.getpwnam("nobody")
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@48", "--allow-commands", "id",
                        "--run-as", "nobody")
    trial = _one_trial(cluster, "whoami", "{command: 'id -u'}")
    assert trial.state == "COMPLETED", (trial.reason, trial.log_tail,  # type: ignore[attr-defined]
                                        cluster.logs("n1"))
    assert str(nobody.pw_uid) in trial.log_tail.split()  # type: ignore[attr-defined]
    (workdir,) = (cluster.tmp / "work").glob("n1/*/*/attempt-1")
    st = workdir.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (nobody.pw_uid, 0o700)
    # The agent's own directories let the trial pass, and list nothing.
    assert (cluster.tmp / "work" / "n1").stat().st_mode & 0o777 == 0o711
    assert (workdir / "log.txt").stat().st_uid == 0  # the log stays the agent's


FLOOD = """
import json, os, sys
path = os.environ["HYPERSACK_METRICS_FILE"]
with open(path, "a") as f:
    f.write(json.dumps({"step": 1, "metrics": {f"m{i:06d}": 1.0 for i in range(300000)}}))
    f.write("\\n")
    f.write(json.dumps({"step": 2, "metrics": {"loss": float(sys.argv[1])}}) + "\\n")
"""


def test_a_trial_cannot_knock_its_node_off_the_cluster(cluster: Cluster,
                                                       tmp_path: Path) -> None:
    """Issue 35: one metrics line of 300,000 names made a 9.6 MB exit the server refused,
    and the agent reconnected for ever; its other trials' exits were never reported."""
    script = tmp_path / "flood.py"
    script.write_text(FLOOD)
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@48", "--allow-commands", "python")
    study = _submit(cluster, space_yaml("flood", models="[resnet18]", batch_sizes="[64]",
                                        lrs="[0.001, 0.01, 0.1]", retries=0,
                                        program=f"{{command: '{{python}} {script} {{lr}}'}}"))
    trials = _done(cluster, study, 90)
    assert {t.state for t in trials} == {"COMPLETED"}, [(t.reason, t.log_tail) for t in trials]
    for t in trials:
        assert t.log_tail.startswith("[hypersack: the agent dropped 1 metrics lines over")
        assert dict(t.metrics) == {"loss": json.loads(t.params_json)["lr"]}
    logs = cluster.logs("n1")
    assert logs.count("registered with") == 1 and "reconnecting" not in logs


LIVE_ESCAPES = [  # issue 35: these ran code from values on agents without --allow-shell
    ("env -u /opt/bin/train /bin/bash -c {code}", "allows only these executables",
     "/opt/bin/train,python"),
    ("{python} {flag} {code}", "placeholder", ""),
    ("{python} -I -c {code}", "with -c runs inline code", ""),
    ("{python} -m timeit -n 1 {code}", "--allow-modules", ""),
    ("timeout -s KILL 60 bash -c {code}", "timeout runs another", ""),
]


def test_the_live_escapes_are_refused_by_a_real_agent(cluster: Cluster) -> None:
    cluster.start_server()
    marker = cluster.tmp / "pwned"
    code = {"python": f"open({str(marker)!r}, 'w')", "shell": f"touch {marker}"}
    for i, (template, reason, allowed) in enumerate(LIVE_ESCAPES):
        if i == 0:  # an agent that allows only these executables
            cluster.start_agent("only", "1xA100-80GB@48", "--allow-commands", allowed)
        elif i == 1:  # then one that allows any
            with cluster.client() as client:
                client.drain("only")
            cluster.start_agent("any", "1xA100-80GB@48", "--allow-commands")
        value = code["shell" if "bash" in template else "python"]
        space = {"name": f"live{i}", "program": {"command": template},
                 "hyperparameters": {"code": [value], "flag": ["-c"]},
                 "settings": {"epochs": 1, "retries": 0, "demand": {
                     "compute_pct": 40, "memory_mib": 2000, "cores": 1, "epoch_s": 1}}}
        (trial,) = _done(cluster, _submit(cluster, json.dumps(space)), 60)
        assert trial.state == "FAILED", (template, trial.log_tail)
        assert reason in trial.log_tail, (template, trial.log_tail)
    assert not marker.exists()
