"""Warm starts on the agent's side: one warm process (`hypersack.runner.zygote`) per
(Unix account, preload list), started in the background the first time a trial of that
kind launches, and asked to fork each later one. A trial forked there starts without
paying its imports (torch takes seconds; a fork takes milliseconds).

Only `python SCRIPT ARGS` and `python -m MODULE ARGS` with the agent's own interpreter
are forked; anything else, or a request the warm process cannot take, starts cold as
before (`Job.start`). A trial launched while its warm process still imports is held
(`WarmPool.ready_by`, `Job.held`) until it is ready, up to the pool's wait, then forked,
or started cold if it is not; the agent goes on with its other commands meanwhile.
Profile runs are held the same way; fused groups never wait (they start cold until it is
ready).

A forked trial is tracked like a cold one: its pid is its process group's, its watchdog
fences that group, the agent's kills reach it, and its exit code comes back from the
warm process, which reaps it.

The warm process runs as the account the trials run as, with the clean environment
trials get (each trial's own variables are set in the forked child), dies with the
agent (a parent-death signal), and kills what it forked when the agent closes its
socket. It is marked like a trial's process (HYPERSACK_AGENT_DIR), so a restarted agent
kills one its predecessor left.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from hypersack.agent.accounts import Account
from hypersack.agent.procs import ENV_AGENT_DIR, ENV_JOB, die_with_parent, switches_user

log = logging.getLogger(__name__)

WARM_MARK = "warm"  # ENV_JOB of a warm process (no job of its own)
SPAWN_TIMEOUT_S = 10.0  # for the warm process to answer a fork request
MAX_REQUEST = 1 << 20  # bytes: a larger request (an enormous environment) starts cold
MAX_POOLS = 16  # warm processes at once; past this, trials of new kinds start cold
# Warm processes of one kind that may die before they are ready (a preload that crashes
# the interpreter, or exits): past this, trials of that kind start cold for the agent's
# life, rather than each start another and wait for it to die.
MAX_STILLBORN = 3


def forkable(argv: list[str]) -> bool:
    """Whether a trial's argument list is one a warm process runs as the interpreter
    would: the agent's own Python, then a script or `-m MODULE`, no interpreter
    options."""
    if len(argv) < 2 or argv[0] != sys.executable:
        return False
    if argv[1] == "-m":
        return len(argv) >= 3 and bool(argv[2]) and not argv[2].startswith("-")
    return not argv[1].startswith("-")


@dataclass
class WarmProcess:
    """A forked trial, as the launcher uses a Popen: its pid (its process group's too),
    `poll` and `wait`. Its exit code comes from the warm process that reaps it."""

    pid: int
    pool: Warm = field(repr=False)
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.pool.exit_of(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode


@dataclass
class Warm:
    """One warm process and the socket to it."""

    key: tuple[int | None, tuple[str, ...]]
    proc: subprocess.Popen[bytes]
    sock: socket.socket
    on_exit: Callable[[], None] = lambda: None  # a forked trial ended
    on_ready: Callable[[], None] = lambda: None  # it is ready, or it died
    ready: bool = False
    # Until when launches of its kind wait for it to get ready (see WarmPool.ready_by);
    # past it, or once a fork request went unanswered, they start cold.
    wait_until: float = 0.0
    stuck: bool = False  # a fork request went unanswered
    dead: bool = False
    failed: dict[str, str] = field(default_factory=dict)
    exits: dict[int, int] = field(default_factory=dict)
    children: set[int] = field(default_factory=set)  # forked for us, exit not yet heard
    _replies: list[dict[str, object]] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _ask: threading.Lock = field(default_factory=threading.Lock)

    def read(self) -> None:
        """The reader thread: the warm process's messages until it closes."""
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                with self._cond:
                    self.dead = True
                    self._cond.notify_all()
                self.on_ready()  # launches waiting for it start cold now
                return
            woken = False
            with self._cond:
                # The warm process runs the trials' account's code (its preloads): what
                # it says is checked like any input.
                try:
                    msg = json.loads(data)
                    if not isinstance(msg, dict):
                        raise ValueError("not an object")
                    if "exit" in msg:
                        pid, code = int(msg["exit"]), int(msg["code"])
                        if pid in self.children:  # only what it forked for us
                            self.children.discard(pid)
                            self.exits[pid] = max(-255, min(255, code))
                            self.on_exit()
                        continue
                    if "pid" in msg and self.stuck:
                        # The answer to a request the agent gave up on (it started that
                        # trial cold): the late fork must not run beside it.
                        self._kill_late(int(msg["pid"]))
                        continue
                    if "pid" in msg:
                        # Counted as ours before its exit can arrive (the messages come
                        # in order); `spawn` checks it is the warm process's child.
                        self.children.add(int(msg["pid"]))
                    if "ready" in msg:
                        failed = msg.get("failed") or {}
                        self.failed = {str(k)[:100]: str(v)[:300]
                                       for k, v in list(dict(failed).items())[:64]}
                except (ValueError, TypeError, KeyError, OverflowError) as exc:
                    log.warning("warm process %s sent a malformed message: %s", self.key,
                                str(exc)[:200])
                    continue
                if "ready" in msg:
                    self.ready = woken = True
                    if self.failed:
                        # A module not installed here (torch on a CPU-only machine) is
                        # the trial's to import, or not: said quietly.
                        absent = all(e.startswith("ModuleNotFoundError")
                                     for e in self.failed.values())
                        log.log(logging.INFO if absent else logging.WARNING,
                                "warm process for %s could not preload %s", self.key,
                                self.failed)
                else:
                    self._replies.append(msg)
                self._cond.notify_all()
            if woken:
                self.on_ready()  # launches waiting for it fork now

    def _kill_late(self, pid: int) -> None:
        try:
            if pid <= 1 or psutil.Process(pid).ppid() != self.proc.pid:
                return  # not its child: nothing of ours to kill
        except psutil.Error:
            return  # gone already
        log.warning("warm process %s forked a trial after the agent gave up on it; killing "
                    "it (pid %d)", self.key, pid)
        for kill in (os.kill, os.killpg):  # it, and its group once it has made one
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass

    def exit_of(self, pid: int) -> int | None:
        with self._cond:
            code = self.exits.pop(pid, None)
            if code is None and self.dead:
                return -9  # its warm process died, and its children with it
            return code

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path, log_fd: int,
              channels: dict[str, int]) -> WarmProcess | None:
        # Absolute: the warm process runs elsewhere (/), and a cold start's directory is
        # relative to the agent's.
        message: dict[str, object] = {"argv": argv, "env": env, "cwd": os.path.abspath(cwd),
                                      "fds": list(channels)}
        request = json.dumps(message).encode()
        if len(request) > MAX_REQUEST:
            return None
        with self._ask:  # one request at a time: replies come in order
            with self._cond:
                if self.dead or not self.ready or self.stuck:
                    return None
                self._replies.clear()
            try:
                socket.send_fds(self.sock, [request], [log_fd, *channels.values()])
            except OSError as exc:
                log.warning("warm process %s: cannot send a request: %s", self.key, exc)
                return None
            with self._cond:
                self._cond.wait_for(lambda: self._replies or self.dead, SPAWN_TIMEOUT_S)
                reply = self._replies.pop(0) if self._replies else None
                if reply is None and not self.dead:
                    # Stopped or stuck (its account's code runs in it): its kind starts
                    # cold from now on, rather than each launch wait for it again.
                    self.stuck = True
        pid = _child_pid(reply, self.proc.pid)
        if pid is None:
            log.warning("warm process %s did not fork the trial: %s", self.key,
                        str((reply or {}).get("error", "no answer, or not its child"))[:300])
            if reply is not None and "pid" in reply:
                with self._cond:
                    self.children.discard(int(str(reply["pid"])))
            return None
        return WarmProcess(pid, self)

    def close(self) -> None:
        """End the warm process: it sees the socket's end, kills what it forked that
        still runs, and exits. (`shutdown` first: a close alone would wait for the
        reader thread's pending receive, and the warm process would see nothing.)"""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def _child_pid(reply: dict[str, object] | None, parent: int) -> int | None:
    """The pid a fork request's reply names, unless it is a live process that is not the
    warm process's child: the agent signals and kills it, and the warm process runs the
    account's code, which must not name, say, another user's process. One that already
    ended (a trial quicker than this check) is gone, and its exit is on the way."""
    if reply is None or "pid" not in reply:
        return None
    try:
        pid = int(str(reply["pid"]))
    except ValueError:
        return None
    if pid <= 1:
        return None
    try:
        return pid if psutil.Process(pid).ppid() == parent else None
    except psutil.NoSuchProcess:
        return pid
    except psutil.Error:
        return None


class WarmPool:
    """The agent's warm processes, by (account, preload list)."""

    def __init__(self, logs: Path, agent_dir: str, base_env: dict[str, str] | None,
                 enabled: bool = True, wait_s: float = 0.0) -> None:
        self.logs = logs
        self.agent_dir = agent_dir
        self.base_env = base_env
        self.enabled = enabled
        # How long the launches of a kind wait for its warm process, from its start,
        # before they start cold instead (0: not at all; see ready_by). A cold start pays
        # the same imports, so waiting rarely costs the first trial anything, and the
        # trials launched with it fork instead of each importing torch on the node's few
        # cores at once.
        self.wait_s = wait_s
        self._pools: dict[tuple[int | None, tuple[str, ...]], Warm] = {}
        self._stillborn: dict[tuple[int | None, tuple[str, ...]], int] = {}
        self._lock = threading.Lock()
        # Called (from a reader thread) when a forked trial ends, or a warm process gets
        # ready or dies: the agent polls then (and starts the launches held for it), not
        # at its next interval.
        self.on_exit: Callable[[], None] = lambda: None

    def ready_by(self, argv: list[str], account: Account | None,
                 preload: tuple[str, ...]) -> float | None:
        """Until when (time.monotonic) a launch of this kind should wait for its warm
        process, still importing, before it starts cold; None: no wait (it is ready,
        gone, given up on, or the trial cannot fork). Starts the kind's warm process if it
        has none. Never blocks: the agent holds the launch and goes on with its other
        commands (kills among them) meanwhile."""
        if self.wait_s <= 0:
            return None
        warm = self._current(argv, account, preload)
        # Once per warm process: one that does not get ready in time (a preload that
        # hangs) has its kind's trials start cold, not each wait again.
        if warm is None or warm.ready or warm.dead or warm.stuck or \
                time.monotonic() >= warm.wait_until:
            return None
        return warm.wait_until

    def spawn(self, argv: list[str], env: dict[str, str], cwd: Path, log_fd: int,
              channels: dict[str, int], account: Account | None,
              preload: tuple[str, ...]) -> WarmProcess | None:
        """The trial forked by a warm process, or None: start it cold (a warm process
        not ready yet is started, or left to get ready, for the trials after it)."""
        warm = self._current(argv, account, preload)
        if warm is None:
            return None
        return warm.spawn(argv, env, cwd, log_fd, channels)

    def _current(self, argv: list[str], account: Account | None,
                 preload: tuple[str, ...]) -> Warm | None:
        """The kind's warm process, started if it has none (a dead one is replaced, up
        to MAX_STILLBORN that died before they were ready); None: its trials start
        cold."""
        if not self.enabled or not forkable(argv):
            return None
        key = (None if account is None else account.uid, preload)
        with self._lock:
            warm = self._pools.get(key)
            if warm is not None and warm.dead:
                warm.close()
                del self._pools[key]
                if not warm.ready:
                    self._stillborn[key] = self._stillborn.get(key, 0) + 1
                given_up = self._stillborn.get(key, 0) >= MAX_STILLBORN
                log.warning("warm process %s ended (exit %s)%s; %s", key, warm.proc.poll(),
                            "" if warm.ready else " before it was ready",
                            "its kind of trial starts cold from now on" if given_up
                            else "starting another")
                warm = None
            if self._stillborn.get(key, 0) >= MAX_STILLBORN:
                return None
            if warm is None:
                if len(self._pools) >= MAX_POOLS:
                    return None
                warm = self._start(key, account)
            return warm

    def _start(self, key: tuple[int | None, tuple[str, ...]], account: Account | None
               ) -> Warm | None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ) if self.base_env is None else dict(self.base_env)
        if account is not None:
            env.update(account.env())
        env[ENV_AGENT_DIR] = self.agent_dir
        env[ENV_JOB] = WARM_MARK
        argv = [sys.executable, "-m", "hypersack.runner.zygote", str(theirs.fileno()),
                json.dumps(list(key[1]))]
        who = None
        if account is not None and switches_user():
            who = (account.uid, account.gid, list(account.groups))
        self.logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        name = f"warm-{'agent' if key[0] is None else key[0]}-{len(self._pools)}.log"
        try:
            with open(self.logs / name, "ab") as out:
                proc = subprocess.Popen(die_with_parent(argv, who), env=env,
                                        stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=subprocess.STDOUT, start_new_session=True,
                                        pass_fds=[theirs.fileno()], cwd="/")
        except OSError as exc:
            log.warning("cannot start a warm process for %s: %s", key, exc)
            mine.close()
            return None
        finally:
            theirs.close()
        warm = Warm(key, proc, mine, on_exit=lambda: self.on_exit(),
                    on_ready=lambda: self.on_exit(),
                    wait_until=time.monotonic() + self.wait_s)
        threading.Thread(target=warm.read, name=f"warm-{proc.pid}", daemon=True).start()
        self._pools[key] = warm
        log.info("warm process %d started for %s (preloading %s)", proc.pid,
                 "the agent's user" if key[0] is None else f"uid {key[0]}",
                 ", ".join(key[1]) or "nothing")
        return warm

    def processes(self) -> list[Warm]:
        """The warm processes now (for `hypersack nodes`-like tools and tests)."""
        with self._lock:
            return list(self._pools.values())

    def wait_ready(self, timeout_s: float) -> bool:
        """Whether every warm process answered within the time (for tests and tools)."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            pools = self.processes()
            if pools and all(w.ready or w.dead for w in pools):
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        with self._lock:
            pools = list(self._pools.values())
            self._pools.clear()
        for warm in pools:
            warm.close()
