"""Process trees of trials: every process a trial starts carries its job's marker in its
environment, dies with the agent, and is found and killed after the trial ends.

- Each trial's first process gets a parent-death signal (SIGKILL when the agent dies),
  so a killed agent does not leave trials running beside their next attempt.
- Every process a trial starts inherits HYPERSACK_AGENT_DIR and HYPERSACK_JOB; a process
  that escaped its group (setsid, a double fork, a child left behind by a trial that
  exited) is still recognised by them and killed.
- The agent daemon is a child subreaper, so such orphans become its children (not
  init's) and it reaps them.
- A restarted agent kills what its previous incarnation left: every process with its
  marker, and the processes its job records name (pid and start time).

What this cannot see: a descendant that clears its environment and escapes the agent's
subreaping; cgroups would catch those (see docs/security.md, what only a cgroup catches).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import logging
import os
import shutil
import signal
import sys
from collections.abc import Iterable
from pathlib import Path

import psutil

log = logging.getLogger(__name__)

ENV_AGENT_DIR = "HYPERSACK_AGENT_DIR"
ENV_JOB = "HYPERSACK_JOB"
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36

_SETPRIV = shutil.which("setpriv")
_libc: ctypes.CDLL | None = None
try:  # Linux; elsewhere the parent-death signal and the subreaper are not available
    _name = ctypes.util.find_library("c")
    _libc = ctypes.CDLL(_name, use_errno=True) if _name else None
except OSError:
    _libc = None


_SHIM = ("import ctypes, ctypes.util, os, sys; "
         f"ctypes.CDLL(ctypes.util.find_library('c')).prctl({PR_SET_PDEATHSIG}, "
         f"{int(signal.SIGKILL)}, 0, 0, 0); os.execvp(sys.argv[1], sys.argv[1:])")


def switches_user() -> bool:
    """Whether `die_with_parent` can also switch to a trial's user (with setpriv)."""
    return _SETPRIV is not None


def die_with_parent(argv: list[str],
                    as_user: tuple[int, int, Iterable[int]] | None = None) -> list[str]:
    """`argv` wrapped so that the process gets SIGKILL when the agent dies: util-linux's
    `setpriv --pdeathsig` where it is installed, else a Python one-liner; both set the
    signal and exec the program (same pid). Not a preexec function: forking a process
    that runs gRPC threads without exec crashes now and then.

    `as_user` (uid, gid, supplementary groups; setpriv only, see `switches_user`):
    setpriv switches to that user too, before the signal is set (a change of user
    clears it) and the exec. Popen's own user= and group= fork without vfork, and the
    forked copy of the agent, gRPC threads and all, crashed now and then (SIGSEGV)."""
    if _SETPRIV is not None:
        who: list[str] = []
        if as_user is not None:
            uid, gid, groups = as_user
            extra = ",".join(str(g) for g in groups)
            who = [f"--reuid={uid}", f"--regid={gid}",
                   f"--groups={extra}" if extra else "--clear-groups"]
        return [_SETPRIV, *who, "--pdeathsig", "KILL", "--", *argv]
    if _libc is not None:
        return [sys.executable, "-c", _SHIM, *argv]
    return argv


def become_subreaper() -> bool:
    """Orphaned descendants of this process's children are reparented to it."""
    if _libc is None:
        return False
    return bool(_libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def tree(pid: int) -> list[psutil.Process]:
    """A process and its descendants (empty if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def children_map() -> dict[int, list[int]]:
    """Each live process's children, from one scan of /proc (every pid is a key). Asking
    `tree` for each of N trials scans /proc N times: 16 trials' trees took 19 ms on an
    idle 2-core machine, on the agent's command thread, once a second."""
    out: dict[int, list[int]] = {}
    for p in psutil.process_iter(["ppid"]):
        out.setdefault(p.pid, [])
        ppid = p.info["ppid"]
        if ppid is not None and ppid != p.pid:
            out.setdefault(ppid, []).append(p.pid)
    return out


def tree_pids(pid: int, children: dict[int, list[int]]) -> list[int]:
    """A process and its descendants by a `children_map` (empty if it was gone)."""
    if pid not in children:
        return []
    out, seen, stack = [], {pid}, [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        for c in children.get(p, ()):
            if c not in seen:
                seen.add(c)
                stack.append(c)
    return out


def signal_all(procs: Iterable[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def _marker(proc: psutil.Process) -> tuple[str, str] | None:
    try:
        env = proc.environ()
    except (psutil.Error, OSError):
        return None
    if ENV_AGENT_DIR not in env:
        return None
    return env[ENV_AGENT_DIR], env.get(ENV_JOB, "")


def _kill(proc: psutil.Process) -> None:
    try:
        proc.kill()
    except psutil.Error:
        return
    if proc.ppid() == os.getpid():  # our child (we are its subreaper): reap it
        try:
            os.waitpid(proc.pid, os.WNOHANG)
        except ChildProcessError:
            pass


def kill_strays(agent_dir: str, live_jobs: set[str], *, everywhere: bool = False) -> int:
    """Kill processes marked with this agent's directory whose job is not live. Only
    orphans (parent: this process or init) are looked at, unless `everywhere` (at an
    agent's start, when nothing of ours can be live). Returns how many were killed."""
    me = os.getpid()
    killed = 0
    for proc in psutil.process_iter(["pid", "ppid"]):
        if proc.pid == me:
            continue
        if not everywhere and proc.info["ppid"] not in (me, 1):
            continue
        marker = _marker(proc)
        if marker is None or marker[0] != agent_dir or marker[1] in live_jobs:
            continue
        log.warning("killing process %d left by job %s", proc.pid, marker[1] or "?")
        _kill(proc)
        killed += 1
    return killed


class Records:
    """One small file per running job (pid, process start time, attempt) under the
    agent's directory, so that a restarted agent knows what its predecessor started."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / (key.replace("/", "_").replace("#", "@") + ".json")

    def add(self, key: str, pid: int, attempt: int) -> None:
        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:
            return
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = self._path(key).with_suffix(".tmp")
        tmp.write_text(json.dumps({"job": key, "pid": pid, "created": created,
                                   "attempt": attempt}))
        tmp.replace(self._path(key))

    def remove(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def kill_leftovers(self) -> int:
        """Kill the recorded processes (and their trees) that still run, then forget
        every record. Returns how many recorded processes were still running."""
        found = 0
        for path in sorted(self.root.glob("*.json")) if self.root.is_dir() else []:
            try:
                rec = json.loads(path.read_text())
                proc = psutil.Process(int(rec["pid"]))
                if abs(proc.create_time() - float(rec["created"])) < 0.01:
                    found += 1
                    log.warning("killing job %s (pid %d) left by a previous agent",
                                rec.get("job"), proc.pid)
                    signal_all(tree(proc.pid), signal.SIGKILL)
            except (ValueError, KeyError, TypeError, OSError, psutil.Error):
                pass
            path.unlink(missing_ok=True)
        return found
