"""The fence's watchdog, with real processes: a trial whose lease lapses is stopped and
marked fenced; one whose lease is renewed runs on; one that ends by itself is not marked."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hypersack.agent.fence import FENCED_MARK, Lease, fence_of, kill_grace_of, watchdog_argv


def _trial() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                            start_new_session=True)


def _watch(lease: Lease, trial: subprocess.Popen[bytes], folder: Path
           ) -> subprocess.Popen[bytes]:
    return subprocess.Popen(watchdog_argv(lease.path, trial.pid, folder / FENCED_MARK, 1.0),
                            start_new_session=True)


def _ended(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    try:
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_a_lapsed_lease_stops_the_trial_and_marks_it(tmp_path: Path) -> None:
    lease = Lease(tmp_path / "lease")
    lease.renew(time.monotonic() + 0.5)
    trial = _trial()
    watchdog = _watch(lease, trial, tmp_path)
    try:
        assert not _ended(trial, 0.2)  # the lease holds
        assert _ended(trial, 30)  # then it lapses: SIGTERM
        assert trial.returncode == -15
        assert (tmp_path / FENCED_MARK).exists()
        assert _ended(watchdog, 30)
    finally:
        trial.kill()
        watchdog.kill()


def test_a_renewed_lease_keeps_the_trial_and_an_ended_trial_is_not_marked(
        tmp_path: Path) -> None:
    lease = Lease(tmp_path / "lease")
    lease.renew(time.monotonic() + 0.5)
    trial = _trial()
    watchdog = _watch(lease, trial, tmp_path)
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # renewed as acknowledged heartbeats would
            lease.renew(time.monotonic() + 0.5)
            time.sleep(0.05)
        assert trial.poll() is None
        trial.terminate()  # it ends by itself: the watchdog goes, and marks nothing
        trial.wait()
        assert _ended(watchdog, 30)
        assert not (tmp_path / FENCED_MARK).exists()
    finally:
        trial.kill()
        watchdog.kill()


def test_the_fence_ends_every_trial_before_the_server_may_requeue() -> None:
    for timeout in (3.0, 30.0, 300.0):
        fence, grace = fence_of(timeout), kill_grace_of(timeout, 5.0)
        assert fence + 0.25 + grace < timeout  # lapse, the watchdog's poll, SIGKILL
    lease = Lease(Path(os.devnull).parent / "unused")
    assert lease.lapsed()  # a new lease holds nothing


def test_a_gated_trial_runs_nothing_until_released_and_a_fenced_one_never(
        tmp_path: Path) -> None:
    """The launch gate (Job.start(gated=True)): the agent starts the trial's process, then
    its watchdog, then lets the program run. An agent frozen between the two leaves a
    process that waits, never a program running unfenced; released with a lapsed lease,
    the program never runs and the job ends fenced."""
    from hypersack.agent.launcher import Job

    code = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran')"
    ran = tmp_path / "ran"
    job = Job("t1", 0, tmp_path / "t1", [sys.executable, "-c", code, str(ran)], {})
    job.start(gated=True)
    time.sleep(0.5)  # far longer than the program takes once let go
    assert not ran.exists() and job.poll() is None  # waiting at the gate
    job.release()
    while job.poll() is None:
        time.sleep(0.01)
    assert job.exit_code == 0 and ran.read_text() == "ran"

    never = tmp_path / "never"
    fenced = Job("t2", 0, tmp_path / "t2", [sys.executable, "-c", code, str(never)], {})
    fenced.start(gated=True)
    fenced.release(fenced=True)
    while fenced.poll() is None:
        time.sleep(0.01)
    assert fenced.fenced and not never.exists()
    # Its stdin was the gate's: the program itself reads /dev/null, as without a gate.
    reads = tmp_path / "reads"
    stdin = Job("t3", 0, tmp_path / "t3", [sys.executable, "-c",
                                           "import sys, pathlib; pathlib.Path(sys.argv[1])"
                                           ".write_text(repr(sys.stdin.read()))", str(reads)],
                {})
    stdin.start(gated=True)
    stdin.release()
    while stdin.poll() is None:
        time.sleep(0.01)
    assert reads.read_text() == "''"
