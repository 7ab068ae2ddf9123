"""The fence: a trial cut off from the server for longer than its node's fence time stops,
before the server may run it again elsewhere, even when the agent itself is frozen
(SIGSTOP, a hung kernel call) or dead.

The agent keeps a lease file per node: the monotonic time (CLOCK_MONOTONIC, the same in
every process of the machine) until which its trials may run. Each heartbeat the server
acknowledges renews it to when that heartbeat was sent plus the fence time, which is
half the server's heartbeat timeout: the server declares the node lost no sooner than a
timeout after it last heard from it, so a lease that lapses (plus the watchdog's poll and
its SIGKILL grace) ends every trial first.

One watchdog per agent (the keeper) runs beside its trials, a process of its own session
(the agent's kills do not reach it, and a frozen agent does not freeze it), started with
the agent and before any trial. It reads the lease every quarter second; once the lease
has lapsed it stops every process marked with the agent's directory in its environment
(HYPERSACK_AGENT_DIR: the trials, their process groups, the warm processes and what
they fork), SIGTERM first and SIGKILL after a grace, and leaves a mark per process in
the agent's `fenced` folder (named by its pid and start time), so the agent reports
those exits as fenced. A trial forked by a warm process while the agent is frozen is covered
the moment it exists. The keeper ends once nothing marked is left and either its agent
is gone or the lease has lapsed; the agent starts another before it starts anything
while the lease holds (nothing starts while it has lapsed).
(One per trial, a new interpreter each, cost about 27 ms of CPU a trial: half a core of
this project's 2-core machines at 48 one-second trials a second.)
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

FENCED_MARK = "fenced"  # the agent's folder where the keeper marks the jobs it stopped
POLL_S = 0.25

# The keeper, run as `python -I -c KEEPER lease agent_dir fenced_dir parent_pid
# parent_start`. Inline, so it imports nothing of HyperSack (nor anything outside the
# standard library).
KEEPER = r"""
import os, signal, sys, time
lease, agent_dir, fenced = sys.argv[1], sys.argv[2], sys.argv[3]
parent, parent_start = int(sys.argv[4]), sys.argv[5]
mark = b"HYPERSACK_AGENT_DIR=" + os.fsencode(agent_dir)
me = os.getpid()
def stat(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
def deadline():  # (until, grace): the lease's end and the SIGKILL grace written with it
    try:
        with open(lease) as f:
            words = f.read().split()
        return float(words[0]), float(words[1]) if len(words) > 1 else 0.1
    except (OSError, ValueError, IndexError):
        return float("inf"), 0.1
def marked():
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if mark in env:
            fields = stat(name)
            if fields is not None:
                found[int(name)] = fields[19]  # its start time: pids are reused
    return found
def same(pid, start):  # still that process, and not ended
    fields = stat(pid)
    return fields is not None and fields[19] == start and fields[0] not in ("Z", "X")
def signal_all(victims, sig):
    for pid, start in victims.items():
        try:
            os.killpg(pid, sig)  # its group (a trial leads its own; a group's id is not
        except OSError:          # reused while any of it lives)
            pass
        if same(pid, start):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
while True:
    until, grace = deadline()
    if time.monotonic() > until:
        victims = marked()
        if not victims:
            break  # nothing to fence: the agent starts another once the lease is renewed
        for pid, start in victims.items():
            try:
                open(os.path.join(fenced, f"{pid}-{start}"), "w").close()
            except OSError:
                pass
        signal_all(victims, signal.SIGTERM)
        end = time.monotonic() + grace
        while time.monotonic() < end and any(same(p, s) for p, s in victims.items()):
            time.sleep(0.05)
        # Their groups whatever is left of them; what else keeps the mark goes at the
        # next poll, if the lease is still lapsed then (a new lease may hold by now).
        signal_all(victims, signal.SIGKILL)
    elif not same(parent, parent_start) and not marked():
        break
    time.sleep(POLL_S)
""".replace("POLL_S", repr(POLL_S))


def keeper_argv(lease: Path, agent_dir: str, fenced: Path) -> list[str]:
    """The keeper's command for the agent running this (its pid and start time: the
    keeper ends once that process is gone and nothing of its trials is left)."""
    return [sys.executable, "-I", "-c", KEEPER, str(lease), agent_dir, str(fenced),
            str(os.getpid()), str(process_start(os.getpid()))]


KEEPER_FILE = "keeper"  # in the agent's folder: its keeper's pid and start time


def record_keeper(path: Path, pid: int) -> None:
    start = process_start(pid)
    if start is not None:
        path.write_text(f"{pid} {start}")


def stop_keeper(path: Path) -> None:
    """Stop the keeper an earlier agent of this folder recorded, if it still runs (the
    same pid and start time): a new agent starts its own."""
    try:
        pid, start = path.read_text().split()
        if process_start(int(pid)) == start:
            os.kill(int(pid), signal.SIGTERM)
    except (OSError, ValueError):
        pass
    path.unlink(missing_ok=True)


def process_start(pid: int) -> str | None:
    """A process's start time (clock ticks since boot, as /proc says): with its pid, what
    names it for good (pids are reused)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def fenced_mark(fenced: Path, pid: int, start: str | None) -> Path | None:
    """Where the keeper marks a process it stopped (by pid and start time: a trial forked
    by a warm process shows its warm process's environment in /proc, not its own)."""
    return None if start is None else fenced / f"{pid}-{start}"


def fence_of(heartbeat_timeout_s: float) -> float:
    """The fence time for a server's heartbeat timeout: half of it."""
    return heartbeat_timeout_s / 2


def kill_grace_of(heartbeat_timeout_s: float, usual_s: float) -> float:
    """How long a fenced trial gets between SIGTERM and SIGKILL: the usual grace, but
    within the quarter of the timeout that is left after the fence and the poll."""
    return max(0.1, min(usual_s, heartbeat_timeout_s / 4 - POLL_S))


class Lease:
    """The node's lease file: until when (monotonic seconds) its trials may run."""

    def __init__(self, path: Path, grace_s: float = 0.1) -> None:
        self.path = path
        self.until = 0.0
        # How long the keeper waits between SIGTERM and SIGKILL, written with the lease
        # (the server's heartbeat timeout, which bounds it, is known only once registered).
        self.grace_s = grace_s
        self._lock = threading.Lock()

    def renew(self, until: float) -> None:
        """Move the lease on (never back), written whole (rename) so the keeper never
        reads half a number: `until grace_s`."""
        with self._lock:  # renewed from the stream's reader thread and the command one
            if until <= self.until:
                return
            self.until = until
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(f"{until!r} {self.grace_s!r}")
            os.replace(tmp, self.path)

    def lapsed(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) > self.until

    def left_s(self) -> float:
        return self.until - time.monotonic()
