"""The fence's keeper, with real processes: once the lease lapses, every process marked
with its agent's directory is stopped and marked fenced (and nothing else); while the
lease is renewed they run on; the keeper ends once its agent is gone and nothing marked
is left."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from hypersack.agent.fence import (
    Lease,
    fence_of,
    fenced_mark,
    keeper_argv,
    kill_grace_of,
    process_start,
)


def _trial(agent_dir: Path, code: str = "import time; time.sleep(300)"
           ) -> subprocess.Popen[bytes]:
    """A process carrying the agent's mark, as a trial does."""
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                            env={**os.environ, "HYPERSACK_AGENT_DIR": str(agent_dir)})


def _keeper(lease: Lease, agent_dir: Path, fenced: Path) -> subprocess.Popen[bytes]:
    fenced.mkdir(exist_ok=True)
    return subprocess.Popen(keeper_argv(lease.path, str(agent_dir), fenced),
                            start_new_session=True)


def _ended(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    try:
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_a_lapsed_lease_stops_what_is_marked_and_marks_it(tmp_path: Path) -> None:
    lease = Lease(tmp_path / "lease", grace_s=1.0)
    lease.renew(time.monotonic() + 0.5)
    trial = _trial(tmp_path)
    # Another agent's trial, and a process of no agent: the keeper leaves them alone.
    other = _trial(tmp_path / "other-agent")
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                             start_new_session=True)
    # A trial that ignores SIGTERM: killed after the grace.
    stubborn = _trial(tmp_path, "import signal, time\n"
                                "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                "time.sleep(300)")
    time.sleep(0.3)  # its handler set
    starts = {p.pid: process_start(p.pid) for p in (trial, stubborn)}
    keeper = _keeper(lease, tmp_path, tmp_path / "fenced")
    try:
        assert not _ended(trial, 0.1)  # the lease holds
        assert _ended(trial, 30)  # then it lapses: SIGTERM
        assert trial.returncode == -15
        assert _ended(stubborn, 30) and stubborn.returncode == -9
        for p in (trial, stubborn):
            mark = fenced_mark(tmp_path / "fenced", p.pid, starts[p.pid])
            assert mark is not None and mark.exists()
        assert other.poll() is None and plain.poll() is None
        assert len(list((tmp_path / "fenced").iterdir())) == 2
    finally:
        for p in (trial, other, plain, stubborn, keeper):
            p.kill()
            p.wait()


def test_a_renewed_lease_keeps_the_trial_and_the_keeper_ends_with_its_agent(
        tmp_path: Path) -> None:
    """Its agent here is a process that starts the keeper and exits at once; the keeper
    guards what is marked until nothing is, then ends."""
    lease = Lease(tmp_path / "lease", grace_s=1.0)
    lease.renew(time.monotonic() + 0.5)
    trial = _trial(tmp_path)
    (tmp_path / "fenced").mkdir()
    agent = subprocess.run(
        [sys.executable, "-c",
         "import subprocess, sys; from pathlib import Path\n"
         "from hypersack.agent.fence import keeper_argv\n"
         "k = subprocess.Popen(keeper_argv(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])),"
         " start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
         "print(k.pid)", str(lease.path), str(tmp_path), str(tmp_path / "fenced")],
        capture_output=True, text=True, check=True)
    keeper = int(agent.stdout.strip())
    try:
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:  # renewed as acknowledged heartbeats would
            lease.renew(time.monotonic() + 0.5)
            time.sleep(0.05)
        assert trial.poll() is None
        assert process_start(keeper) is not None  # its agent is gone, a trial is not
        trial.terminate()  # it ends by itself: nothing is marked fenced, the keeper goes
        trial.wait()
        for _ in range(200):
            if process_start(keeper) is None or _zombie(keeper):
                break
            time.sleep(0.05)
        assert process_start(keeper) is None or _zombie(keeper)
        assert not list((tmp_path / "fenced").iterdir())
    finally:
        trial.kill()
        trial.wait()
        try:
            os.kill(keeper, 9)
        except OSError:
            pass


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


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
