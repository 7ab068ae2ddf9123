"""A trial's metrics and profile channels are descriptors it inherits, on files of the
agent's in a folder of the agent's: another trial, even of the same Unix account, cannot
write them by path nor through /proc/PID/fd (issue 35: with --run-as, one user's trial
appended a NaN to another's metrics file and all 4 of their trials were killed)."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hypersack.agent.accounts import lookup
from hypersack.agent.launcher import Job

VICTIM = """
import os, time
fd = int(os.environ["HYPERSACK_METRICS_FD"])
assert "HYPERSACK_METRICS_FILE" not in os.environ
os.write(fd, b'{"step": 1, "metrics": {"loss": 0.5}}\\n')
time.sleep(4)
os.write(fd, b'{"step": 2, "metrics": {"loss": 0.25}}\\n')
"""

ATTACKER = """
import os, sys
victim = sys.argv[1]
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\\0")
    except OSError:
        continue
    env = dict(e.decode(errors="replace").partition("=")[::2] for e in env if b"=" in e)
    if env.get("HYPERSACK_TRIAL_ID") != victim:
        continue
    n = env["HYPERSACK_METRICS_FD"]
    for path in (f"/proc/{pid}/fd/{n}", sys.argv[2]):
        try:
            with open(path, "a") as f:
                f.write('{"step": 1, "metrics": {"loss": NaN}}\\n')
            print("WROTE", path)
        except OSError as exc:
            print("DENIED", path, exc.errno)
    print("FOUND", pid)
"""

needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="running trials as another user needs root")


@pytest.fixture
def agent_dir() -> Iterator[Path]:
    """A work folder others may pass through (pytest's own is root's, 0700)."""
    top = Path(tempfile.mkdtemp(prefix="hs-chan-", dir="/tmp"))
    top.chmod(0o711)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def wait(job: Job, timeout_s: float = 30) -> int:
    end = time.monotonic() + timeout_s
    while (code := job.poll()) is None:
        assert time.monotonic() < end, "the job did not end"
        time.sleep(0.05)
    return code


@needs_root
def test_a_trial_of_the_same_account_cannot_write_anothers_metrics(agent_dir: Path) -> None:
    nobody = lookup("nobody")
    py = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    # The attacker looks through every process for this id: one of this run's own, so
    # that another run of the suite on the machine (its victim) is not found too.
    name = f"victim-{agent_dir.name[-8:]}"
    victim = Job(name, 0, agent_dir / "s" / name, [py, "-c", VICTIM],
                 {"HYPERSACK_TRIAL_ID": name}, base_env={"PATH": "/usr/bin:/bin"},
                 account=nobody, agent_dir=str(agent_dir))
    victim.start()
    time.sleep(1.0)
    attacker = Job("evil-t0", 0, agent_dir / "s" / "evil-t0",
                   [py, "-c", ATTACKER, name, str(victim.metrics_path)],
                   {"HYPERSACK_TRIAL_ID": "evil-t0"}, base_env={"PATH": "/usr/bin:/bin"},
                   account=nobody, agent_dir=str(agent_dir))
    attacker.start()
    assert wait(attacker) == 0, attacker.log_tail()
    lines = attacker.log_tail().splitlines()
    said = [line.split()[0] for line in lines if line.split()[:1] in (["FOUND"], ["WROTE"],
                                                                        ["DENIED"])]
    assert said == ["DENIED", "DENIED", "FOUND"], lines
    assert wait(victim) == 0, victim.log_tail()
    victim.last_metrics()
    assert victim.metrics == {"loss": 0.25} and victim.step == 2  # nothing forged
    assert (victim.channel_dir.stat().st_uid, victim.channel_dir.stat().st_mode & 0o777) \
        == (0, 0o700)


def test_the_sdk_reports_through_the_inherited_descriptor(tmp_path: Path) -> None:
    program = ("from hypersack.runner import sdk\n"
               "sdk.report(step=3, loss=0.125)\n")
    job = Job("t0", 0, tmp_path / "s" / "t0", [sys.executable, "-c", program], {},
              base_env=dict(os.environ))
    job.start()
    assert wait(job) == 0, job.log_tail()
    job.last_metrics()
    assert job.metrics == {"loss": 0.125} and job.step == 3
