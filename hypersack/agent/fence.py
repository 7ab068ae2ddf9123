"""The fence: a trial cut off from the server for longer than its node's fence time stops,
before the server may run it again elsewhere, even when the agent itself is frozen
(SIGSTOP, a hung kernel call) or dead.

The agent keeps a lease file per node: the monotonic time (CLOCK_MONOTONIC, the same in
every process of the machine) until which its trials may run. Each heartbeat the server
acknowledges renews it to when that heartbeat was sent plus the fence time, which is
half the server's heartbeat timeout: the server declares the node lost no sooner than a
timeout after it last heard from it, so a lease that lapses (plus the watchdog's poll and
its SIGKILL grace) ends every trial first.

Beside each trial runs a small watchdog, a process of its own session (the agent's kills
of the trial do not reach it, and a frozen agent does not freeze it): it reads the lease
every quarter second, and once the lease has lapsed while the trial still runs, it marks
the trial fenced, sends SIGTERM to the trial's process group, and SIGKILL after a grace.
It ends with the trial.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

FENCED_MARK = "fenced"  # the file a watchdog leaves in the trial's folder
POLL_S = 0.25

# The watchdog, run as `python -I -c WATCHDOG lease pgid marker grace_s`. Inline, so it
# starts in milliseconds and imports nothing of HyperSack.
WATCHDOG = r"""
import os, signal, sys, time
lease, pgid, marker, grace = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
def state():
    try:
        with open(f"/proc/{pgid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"
def deadline():
    try:
        with open(lease) as f:
            return float(f.read().strip())
    except (OSError, ValueError):
        return float("inf")
while state() not in ("gone", "Z", "X"):
    if time.monotonic() > deadline():
        try:
            open(marker, "w").close()
        except OSError:
            pass
        try:
            os.killpg(pgid, signal.SIGTERM)
        except OSError:
            pass
        end = time.monotonic() + grace
        while time.monotonic() < end:
            try:
                os.killpg(pgid, 0)
            except OSError:
                break
            time.sleep(0.05)
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
        break
    time.sleep(POLL_S)
""".replace("POLL_S", repr(POLL_S))


def fence_of(heartbeat_timeout_s: float) -> float:
    """The fence time for a server's heartbeat timeout: half of it."""
    return heartbeat_timeout_s / 2


def kill_grace_of(heartbeat_timeout_s: float, usual_s: float) -> float:
    """How long a fenced trial gets between SIGTERM and SIGKILL: the usual grace, but
    within the quarter of the timeout that is left after the fence and the poll."""
    return max(0.1, min(usual_s, heartbeat_timeout_s / 4 - POLL_S))


class Lease:
    """The node's lease file: until when (monotonic seconds) its trials may run."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.until = 0.0

    def renew(self, until: float) -> None:
        """Move the lease on (never back), written whole (rename) so a watchdog never
        reads half a number."""
        if until <= self.until:
            return
        self.until = until
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(repr(until))
        os.replace(tmp, self.path)

    def lapsed(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) > self.until

    def left_s(self) -> float:
        return self.until - time.monotonic()


def watchdog_argv(lease: Path, pgid: int | str, marker: Path, grace_s: float) -> list[str]:
    """The watchdog's command (`pgid` "{pgid}": the warm process puts in the trial's)."""
    return [sys.executable, "-I", "-c", WATCHDOG, str(lease), str(pgid), str(marker),
            f"{grace_s:g}"]
