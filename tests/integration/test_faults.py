"""Faults and elasticity with real processes: agents and the server die, join, drain."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from hypersack.testing.cluster import (
    ATTEMPT_LOGGER,
    FAST_LOSS,
    Cluster,
    attempt_runs,
    overlapping,
    space_yaml,
    wait_for,
)
from hypersack.testing.cluster import done as _done
from hypersack.testing.cluster import submit as _submit
from hypersack.testing.cluster import trials as _trials

RESTART_FLAGS = ("--heartbeat-timeout-s", "20")  # the agents' fence: 10 s


def test_agent_killed_mid_study_its_trials_finish_elsewhere(cluster: Cluster) -> None:
    cluster.start_server(*FAST_LOSS)
    cluster.start_agent("n1")
    study = _submit(cluster, space_yaml("killed", seconds_per_epoch=2.0, ratio=1.0))
    wait_for("trials running on n1",
             lambda: any(t.node == "n1" and t.state == "RUNNING" for t in _trials(cluster, study)))
    cluster.start_agent("n2")
    on_n1 = {t.id for t in _trials(cluster, study) if t.node == "n1" and t.state == "RUNNING"}
    cluster.kill_agent("n1")
    trials = _done(cluster, study)
    assert {t.state for t in trials} == {"COMPLETED"}, [(t.id, t.state, t.reason) for t in trials]
    moved = [t for t in trials if t.id in on_n1]
    assert moved and all(t.node == "n2" and t.launches == 2 for t in moved)
    assert all(t.has_objective for t in trials)


def test_agent_joining_mid_study_gets_work(cluster: Cluster) -> None:
    cluster.start_server()
    cluster.start_agent("n1")
    study = _submit(cluster, space_yaml("join", seconds_per_epoch=1.0, ratio=1.0,
                                        lrs="[0.001, 0.003, 0.01]"))
    wait_for("n1 busy", lambda: any(t.state == "RUNNING" for t in _trials(cluster, study)))
    assert any(t.state == "PENDING" for t in _trials(cluster, study))  # n1 alone is full
    joined_at = time.time()
    cluster.start_agent("n2")
    trials = _done(cluster, study)
    assert {t.state for t in trials} == {"COMPLETED"}
    on_n2 = [t for t in trials if t.node == "n2"]
    assert on_n2 and all(t.started_at >= joined_at for t in on_n2)


def test_drained_node_gets_no_new_trials_and_finishes_its_own(cluster: Cluster) -> None:
    cluster.start_server()
    cluster.start_agent("n1")
    cluster.start_agent("n2")
    study = _submit(cluster, space_yaml("drain", seconds_per_epoch=1.5, ratio=1.0,
                                        lrs="[0.001, 0.003, 0.01]"))
    wait_for("both nodes busy", lambda: {t.node for t in _trials(cluster, study)
                                         if t.state == "RUNNING"} == {"n1", "n2"})
    with cluster.client() as client:
        node = client.drain("n1")
        assert node.draining
    drained_at = time.time()
    running_on_n1 = {t.id for t in _trials(cluster, study)
                     if t.node == "n1" and t.state == "RUNNING"}
    trials = _done(cluster, study)
    assert {t.state for t in trials} == {"COMPLETED"}
    late_on_n1 = [t.id for t in trials if t.node == "n1" and t.started_at > drained_at]
    assert late_on_n1 == []
    assert all(t.node == "n1" and t.launches == 1 for t in trials if t.id in running_on_n1)
    with cluster.client() as client:
        n1 = next(n for n in client.nodes() if n.name == "n1")
        assert n1.draining and n1.connected


def test_crashing_trial_is_retried_then_failed_with_its_log(cluster: Cluster,
                                                            tmp_path: Path) -> None:
    cluster.start_server()
    cluster.start_agent("n1")
    script = tmp_path / "crash.py"
    script.write_text("import sys\nprint('boom at lr', sys.argv[1])\nsys.exit(3)\n")
    crash = f"{{command: '{{python}} {script} {{lr}}'}}"
    study = _submit(cluster, space_yaml("crash", models="[resnet18]", batch_sizes="[64]",
                                        lrs="[0.001]", retries=1, program=crash))
    trials = _done(cluster, study, 60)
    (t,) = trials
    assert t.state == "FAILED" and t.failures == 2 and t.launches == 2
    assert "exit code 3" in t.reason and "boom at lr 0.001" in t.log_tail
    out = subprocess.run([sys.executable, "-m", "hypersack.cli.main", "logs", t.id,
                          *cluster.cli_flags()], capture_output=True, text=True, check=True,
                         env={**os.environ, "HYPERSACK_TOKEN": cluster.admin_token}).stdout
    assert "FAILED" in out and "boom at lr 0.001" in out and "exit code 3" in out


def test_server_killed_and_restarted_study_completes_once(cluster: Cluster) -> None:
    # A restart shorter than the agents' fence (half the heartbeat timeout): their trials
    # keep running through it. (Longer, and they stop: the fence cannot tell a restarting
    # server from one that lost the node and runs its trials elsewhere.)
    cluster.start_server(*RESTART_FLAGS)
    cluster.start_agent("n1")
    cluster.start_agent("n2")
    study = _submit(cluster, space_yaml("restart", seconds_per_epoch=1.5, ratio=1.0,
                                        lrs="[0.001, 0.003, 0.01]"))
    wait_for("some trials done and some running", lambda: (
        {"COMPLETED", "RUNNING"} <= {t.state for t in _trials(cluster, study)}), 60, 0.2)
    running = {t.id for t in _trials(cluster, study) if t.state == "RUNNING"}
    cluster.kill_server()
    time.sleep(1.0)  # agents notice and keep their trials running
    cluster.start_server(*RESTART_FLAGS)
    trials = _done(cluster, study)
    assert {t.state for t in trials} == {"COMPLETED"}
    # Adopted, not started again: every trial's process started exactly once (a launch
    # the dying server committed but never sent is sent again, as attempt 2: the agents
    # started it once all the same) and has one result.
    logs = "".join((cluster.tmp / f"{n}.log").read_text() for n in ("n1", "n2"))
    started = {t.id: logs.count(f"launched {t.id} (") for t in trials}
    assert started == {t.id: 1 for t in trials}
    assert running and all(t.has_objective for t in trials)


ESCAPER = """
import os, signal, subprocess, sys, time
# A trial that starts a child in a session of its own that ignores SIGTERM: the kind of
# descendant that escapes a process-group kill.
child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                          "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"],
                         start_new_session=True)
with open("pids.txt", "w") as f:
    f.write(f"{os.getpid()} {child.pid}\\n")
time.sleep(300)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _environ(pid: int | str) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def _marked(workdir: str) -> list[int]:
    """Processes that carry this cluster's agent marker in their environment, but for
    the agent's warm processes themselves (HYPERSACK_JOB=warm, a child of the unmarked
    agent), which live as long as it does: a trial forked from one shows the warm
    process's environment and has it as its parent, so it still counts."""
    marker = f"HYPERSACK_AGENT_DIR={workdir}".encode()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        env = _environ(entry)
        if marker not in env or not _alive(int(entry)):
            continue
        if b"\0HYPERSACK_JOB=warm\0" in b"\0" + env + b"\0":
            try:
                parent = psutil.Process(int(entry)).ppid()
            except psutil.Error:
                continue
            if marker not in _environ(parent):
                continue  # a warm process, not a trial's
        out.append(int(entry))
    return out


def test_killed_agent_leaves_nothing_running_twice_and_nothing_after(
        cluster: Cluster, tmp_path: Path) -> None:
    script = tmp_path / "escaper.py"
    script.write_text(ESCAPER)
    cluster.start_server(*FAST_LOSS)
    cluster.start_agent("n1")
    study = _submit(cluster, space_yaml(
        "escape", models="[resnet18]", batch_sizes="[64]", lrs="[0.001]",
        program=f"{{command: '{{python}} {script}'}}"))
    wait_for("the trial running", lambda: any(t.state == "RUNNING"
                                              for t in _trials(cluster, study)))
    agent_dir = str((tmp_path / "work" / "n1").resolve())

    def pids_file(attempt: int) -> Path | None:
        found = [p for p in Path(agent_dir).rglob(f"attempt-{attempt}/pids.txt")
                 if p.read_text().strip()]
        return found[0] if found else None

    wait_for("its processes", lambda: pids_file(1) is not None)
    first = pids_file(1)
    assert first is not None
    trial_pid, escaped_pid = map(int, first.read_text().split())
    cluster.kill_agent("n1")
    # The trial dies with its agent (parent-death signal): its next attempt never runs
    # beside it. Its escaped child is what a restarted agent must find.
    wait_for("the trial to die with its agent", lambda: not _alive(trial_pid), 10, 0.1)
    cluster.start_agent("n1")
    wait_for("the escaped child to be killed", lambda: not _alive(escaped_pid), 20, 0.1)
    wait_for("attempt 2", lambda: pids_file(2) is not None, 30, 0.2)
    (trial,) = _trials(cluster, study)
    assert trial.launches == 2 and trial.state == "RUNNING"
    with cluster.client() as client:
        client.cancel(study)
    # Cancelled: the whole tree goes, the child that ignores SIGTERM included.
    wait_for("no process left", lambda: not _marked(agent_dir), 30, 0.2)


def test_a_frozen_agents_trials_are_fenced_before_they_run_elsewhere(
        cluster: Cluster, tmp_path: Path) -> None:
    """The issue's freeze: an agent SIGSTOPped for three heartbeat timeouts. Its trials
    stop by its fence before the server runs them on the other node, so no trial runs in
    two places at once, and each completes exactly once."""
    script, log = tmp_path / "logger.py", tmp_path / "runs.log"
    script.write_text(ATTEMPT_LOGGER)
    cluster.start_server(*FAST_LOSS)
    cluster.start_agent("n1", "1xA100-80GB@48")
    cluster.start_agent("n2", "1xA100-80GB@48")
    study = _submit(cluster, space_yaml(
        "freeze", models="[resnet18]", batch_sizes="[64]", epochs=1,
        lrs="[" + ", ".join(f"0.00{i}" for i in range(1, 9)) + "]",
        program=f"{{command: '{{python}} {script} {log} 4'}}"))
    wait_for("trials on both nodes", lambda: {t.node for t in _trials(cluster, study)
                                             if t.state == "RUNNING"} == {"n1", "n2"}, 60, 0.1)

    def fresh_on_n1() -> bool:
        """A trial of n1 started less than a second ago: it still has three of its four
        seconds to run when the freeze's fence (1.5 s after the last heartbeat) stops
        it, whatever the load (a trial near its end would finish first)."""
        on_n1 = {t.id for t in _trials(cluster, study)
                 if t.state == "RUNNING" and t.node == "n1"}
        now = time.time()
        return log.exists() and any(
            trial in on_n1 and not ended and now - first < 1.0
            for (trial, _), (first, _, ended) in attempt_runs(log).items())

    wait_for("a trial just started on n1", fresh_on_n1, 60, 0.05)
    frozen = cluster.agents["n1"]
    os.kill(frozen.pid, signal.SIGSTOP)
    time.sleep(9.0)  # three times the heartbeat timeout (3 s)
    os.kill(frozen.pid, signal.SIGCONT)
    trials = _done(cluster, study, 120)
    assert {t.state for t in trials} == {"COMPLETED"}, [(t.id, t.reason) for t in trials]
    runs = attempt_runs(log)
    by_trial: dict[str, list[tuple[float, float, bool]]] = {}
    for (trial, _), run in runs.items():
        by_trial.setdefault(trial, []).append(run)
    assert sorted(by_trial) == sorted(t.id for t in trials)
    for trial, attempts in by_trial.items():
        assert sum(ended for *_, ended in attempts) == 1, (trial, attempts)  # once, to the end
    assert overlapping(runs) == [], "two attempts at once"
    assert any(len(a) > 1 for a in by_trial.values())  # the freeze did stop some
    assert all(t.failures == 0 for t in trials)  # a fenced trial is no failure


def test_a_launch_slower_than_the_fence_does_not_fence_the_node(cluster: Cluster,
                                                                tmp_path: Path) -> None:
    """Found on an H200: a trial's warm process took 7 s to import torch, the agent waited
    for it (up to 10 s) while the server's acknowledgements of its heartbeats queued behind
    that launch, and its fence (half the heartbeat timeout) lapsed: the keeper killed the
    warm process, the next launch started another and waited again, and the run never
    ended. The heartbeats the server acknowledges renew the lease whatever a command is
    doing, so a preload slower than the fence (here 4 s against 1.5 s) is waited for and
    the trials fork from it."""
    (tmp_path / "slowload.py").write_text("import time\ntime.sleep(4)\n")
    script, seen = tmp_path / "probe.py", tmp_path / "seen.txt"
    script.write_text("import sys\nwith open(sys.argv[1], 'a') as f:\n"
                      "    f.write(str('slowload' in sys.modules) + '\\n')\n")
    cluster.start_server(*FAST_LOSS)
    cluster.start_agent("n1", "1xA100-80GB@48", "--pass-env", "PYTHONPATH",
                        env={**os.environ, "PYTHONPATH": os.pathsep.join(
                            [str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    study = _submit(cluster, space_yaml(
        "slow-preload", models="[resnet18]", batch_sizes="[64]", epochs=1,
        lrs="[0.001, 0.002]", program=f"{{command: '{{python}} {script} {seen}', "
                                      f"preload: [slowload]}}"))
    trials = _done(cluster, study, 90)
    assert {t.state for t in trials} == {"COMPLETED"}, [(t.id, t.reason) for t in trials]
    assert all(t.launches == 1 and t.failures == 0 for t in trials)
    # Both forked from the one warm process (a cold start never imports slowload).
    assert seen.read_text().split() == ["True", "True"], seen.read_text()
    assert "ended (exit" not in cluster.logs("n1")
    assert not any((cluster.tmp / "work").glob("*/fenced/*"))


def test_a_launch_held_for_its_warm_process_is_killed_at_once(cluster: Cluster,
                                                              tmp_path: Path) -> None:
    """A launch whose warm process still imports is held, not waited for: the agent goes
    on with its commands meanwhile, so a study cancelled then ends its trial before it
    ever runs (the agent used to wait up to 10 s for the import first, and the trial
    then ran and was killed), and the next launch of its kind forks from the same warm
    process."""
    (tmp_path / "slowload.py").write_text("import time\ntime.sleep(8)\n")
    script, seen = tmp_path / "probe.py", tmp_path / "seen.txt"
    script.write_text("import sys\nwith open(sys.argv[1], 'a') as f:\n"
                      "    f.write(str('slowload' in sys.modules) + '\\n')\n")
    cluster.start_server()
    cluster.start_agent("n1", "1xA100-80GB@48", "--pass-env", "PYTHONPATH",
                        env={**os.environ, "PYTHONPATH": os.pathsep.join(
                            [str(tmp_path), os.environ.get("PYTHONPATH", "")])})
    program = f"{{command: '{{python}} {script} {seen}', preload: [slowload]}}"
    study = _submit(cluster, space_yaml("held", models="[resnet18]", batch_sizes="[64]",
                                        epochs=1, lrs="[0.001]", program=program))
    wait_for("the launch held", lambda: "waits up to" in cluster.logs("n1"), 60, 0.1)
    with cluster.client() as client:
        client.cancel(study)
    wait_for("the held trial killed", lambda: "killing" in cluster.logs("n1"), 30, 0.1)
    (trial,) = _done(cluster, study, 60)
    assert trial.state == "CANCELLED", (trial.state, trial.reason)
    assert not seen.exists()  # it never ran
    again = _submit(cluster, space_yaml("held-again", models="[resnet18]",
                                        batch_sizes="[64]", epochs=1, lrs="[0.002]",
                                        program=program))
    (trial,) = _done(cluster, again, 60)
    assert trial.state == "COMPLETED", (trial.state, trial.reason)
    assert seen.read_text().split() == ["True"]  # forked from the one warm process
    assert "ended (exit" not in cluster.logs("n1")
