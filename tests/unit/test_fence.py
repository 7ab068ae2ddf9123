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
