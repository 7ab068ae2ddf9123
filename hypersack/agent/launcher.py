"""Starts trial and profile processes: an argument list (never a shell string), its own
working directory and log file, its device in the environment. What the agent reads of
its output (metrics, the log) is `output.JobOutput`'s."""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import psutil

from hypersack.agent.accounts import Account
from hypersack.agent.fence import process_start
from hypersack.agent.output import JobOutput, open_regular
from hypersack.agent.procs import (
    ENV_AGENT_DIR,
    ENV_JOB,
    die_with_parent,
    signal_all,
    switches_user,
    tree,
    tree_pids,
)
from hypersack.agent.warm import WarmPool, WarmProcess
from hypersack.core import trial_env as sdk
from hypersack.core.errors import InvalidInput
from hypersack.core.trial_env import as_text
from hypersack.grid.space import PLACEHOLDER, Program

log = logging.getLogger(__name__)

KILL_GRACE_S = 5.0
PASSABLE = 0o711  # others may pass through (to their own directory), not list
LOG_MAX_BYTES = 64 << 20  # default cap on a trial's log: log.txt plus the kept tail
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")


def argv_for(program: Program, fields: dict[str, Any]) -> list[str]:
    """The argument list: built-ins run as `python -m hypersack.runner.NAME`; a command
    template is split first, then each `{name}` is replaced by its value as text."""
    if program.builtin is not None:
        return [sys.executable, "-m", f"hypersack.runner.{program.builtin}"]
    assert program.command is not None
    # The agent's own fields win over hyperparameters of the same name.
    values = {**fields, "python": sys.executable}

    def fill(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in values:
            raise InvalidInput(f"command template: no value for {{{name}}}")
        return as_text(values[name])

    return [PLACEHOLDER.sub(fill, arg) for arg in shlex.split(program.command)]


# What a warm process imports for a built-in program before it forks the trial: the
# SDK and the program (for the zoo, torch and its trainer where installed).
BUILTIN_PRELOAD = {"train": ("hypersack.runner.train", "torch", "hypersack.runner.torch_train"),
                   "sleep": ("hypersack.runner.sleep",)}


def preload_of(program: Program) -> tuple[str, ...]:
    """The modules a trial's warm process preloads: the SDK, then the built-in program's
    own or the command program's `preload` list."""
    own = BUILTIN_PRELOAD.get(program.builtin, ()) if program.builtin else \
        tuple(program.preload)
    return ("hypersack.runner.sdk", *own)


# A gated start (Job.start): the shell runs the program only once it reads "go".
SH = "/bin/sh"
GATE = 'IFS= read -r go; [ "$go" = go ] || exit 75; exec "$@" </dev/null'


@dataclass
class Job(JobOutput):
    """One child process: a trial, or a profile run of a workload."""

    id: str
    gpu_index: int
    workdir: Path
    argv: list[str]
    env: dict[str, str]
    profile: bool = False
    attempt: int = 0
    agent_dir: str = ""  # the agent's marker in every process of the job
    base_env: dict[str, str] | None = None  # what it sees of the agent's environment (None: all)
    account: Account | None = None  # the Unix user it runs as (None: the agent's)
    log_max_bytes: int = LOG_MAX_BYTES
    # Where it may start warm (forked from a process that preloaded these modules; see
    # hypersack.agent.warm), else cold.
    warm: WarmPool | None = None
    preload: tuple[str, ...] = ()
    proc: subprocess.Popen[bytes] | WarmProcess | None = None
    # A launch held until then (time.monotonic) for its warm process to get ready, not
    # started yet (see LaunchCommands._start_held); None: started when launched.
    hold_until: float | None = None
    started_at: float = 0.0
    killed_at: float | None = None
    exit_code: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    step: int = 0
    # Each step's own metrics since they last went to the server (its learning curve).
    unsent: dict[int, dict[str, float]] = field(default_factory=dict)
    # Seconds per iteration the trial last said it saw, over a window of seconds (the
    # SDK's report; 0: not measured since the last message).
    iter_time_s: float = 0.0
    iter_window_s: float = 0.0
    peak_memory_mib: int = 0  # observed by the device backend while it ran; 0: not measured
    peak_util_pct: float = 0.0
    memory_mib: int = 0  # as last observed
    util_pct: float = 0.0
    ended: str = ""  # a fused member's own end (completed, diverged, stopped), from its file
    fenced: bool = False  # stopped by the node's fence (see hypersack.agent.fence)
    proc_start: str | None = None  # its process's start time (clock ticks, /proc)
    dropped: dict[str, int] = field(default_factory=dict)  # what of its output was dropped
    metrics_sent_at: float = -1e9  # when its metrics last went to the server
    metrics_due: bool = False  # newer metrics wait for METRICS_EVERY_S
    _skip_line: bool = False
    _metrics_pos: int = 0
    _log: IO[bytes] | None = None
    _tree: list[psutil.Process] = field(default_factory=list)

    @property
    def key(self) -> str:
        return job_key(self.id, self.attempt)

    @property
    def log_path(self) -> Path:
        return self.workdir / "log.txt"

    @property
    def kept_log_path(self) -> Path:
        """The tail of the log kept at the last rotation."""
        return self.workdir / "log.1.txt"

    @property
    def channel_dir(self) -> Path:
        """Where the trial's metrics and profile result land: beside its work directory,
        the agent's own (0700), so no trial reaches another's by path. The trial writes
        them through descriptors it inherits (see `start`)."""
        return self.workdir.parent / f".channel-{self.workdir.name}"

    @property
    def metrics_path(self) -> Path:
        return self.channel_dir / "metrics.jsonl"

    @property
    def profile_path(self) -> Path:
        return self.channel_dir / "profile.json"

    def _channels(self, env: dict[str, str]) -> dict[str, int]:
        """Open the trial's channels for it to inherit: the metrics file (append only)
        and, for a profile run, the profile result. The files are the agent's, mode
        0600, in the agent's 0700 folder: a trial of another owner, or of the same Unix
        account, can open neither by path nor through /proc/PID/fd (which checks the
        file's owner again). Only a trial that runs as the agent's own user also gets
        the metrics file as a path (HYPERSACK_METRICS_FILE, /dev/fd/N)."""
        self.channel_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.channel_dir, 0o700)
        for p in (self.metrics_path, self.profile_path):
            p.unlink(missing_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        fds = {sdk.ENV_METRICS_FD: os.open(self.metrics_path, flags | os.O_APPEND, 0o600)}
        env[sdk.ENV_METRICS_FD] = str(fds[sdk.ENV_METRICS_FD])
        if self.account is None:
            env[sdk.ENV_METRICS] = f"/dev/fd/{fds[sdk.ENV_METRICS_FD]}"
        if self.profile:
            fds[sdk.ENV_PROFILE_FD] = os.open(self.profile_path, flags, 0o600)
            env[sdk.ENV_PROFILE_FD] = str(fds[sdk.ENV_PROFILE_FD])
            env[sdk.ENV_PROFILE] = f"/dev/fd/{fds[sdk.ENV_PROFILE_FD]}"
        return fds

    def start(self, gated: bool = False) -> None:
        """Start the process. `gated`: it waits, before the program runs, until
        `release` lets it (a cold start: a shell reads one line from its stdin, then
        execs the program with stdin from /dev/null), so its fence can be in place
        first; a warm start's warm process starts the fence before it forks the trial."""
        self.workdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.kept_log_path.unlink(missing_ok=True)
        env = dict(os.environ) if self.base_env is None else dict(self.base_env)
        env.update(self.env)
        if self.account is not None:
            env.update(self.account.env())
        if self.agent_dir:
            env[ENV_AGENT_DIR] = self.agent_dir
            env[ENV_JOB] = self.key
        env.pop(sdk.ENV_METRICS, None)
        env.pop(sdk.ENV_PROFILE, None)
        self._log = open_regular(self.log_path, "ab")
        self._log.write(f"$ {shlex.join(self.argv)}\n".encode())
        self._log.flush()
        who: dict[str, Any] = {}
        program = [SH, "-c", GATE, "hypersack-gate", *self.argv] if gated else self.argv
        argv = die_with_parent(program)
        checkpoint = self.env.get(sdk.ENV_CHECKPOINT_DIR)
        if checkpoint:
            # The attempt's own checkpoint folder (see Checkpoints.attempt), in the
            # trial's, which the trial's user may pass through.
            folder = Path(checkpoint)
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            if self.account is not None:
                os.chmod(folder.parent, PASSABLE)
                for path in (folder, *folder.rglob("*")):  # the copy it resumes from too
                    os.chown(path, self.account.uid, self.account.gid,
                             follow_symlinks=False)
                self.account.own(folder)
        if self.account is not None:
            # The directory becomes the trial user's own; the log stays the agent's (the
            # trial writes it through its stdout only).
            self.give_workdir()
            if switches_user():  # setpriv switches user in the exec'd wrapper
                argv = die_with_parent(program, (self.account.uid, self.account.gid,
                                                 list(self.account.groups)))
            else:
                who = {"user": self.account.uid, "group": self.account.gid,
                       "extra_groups": list(self.account.groups)}
        channels = self._channels(env)  # opened last: nothing between them and their close
        try:
            if self.warm is not None:
                self.proc = self.warm.spawn(self.argv, env, self.workdir, self._log.fileno(),
                                            channels, self.account, self.preload)
            if self.proc is None:
                self.proc = subprocess.Popen(argv, cwd=self.workdir,
                                             env=env, stdin=subprocess.PIPE if gated
                                             else subprocess.DEVNULL,
                                             stdout=self._log, stderr=subprocess.STDOUT,
                                             start_new_session=True,
                                             pass_fds=list(channels.values()), **who)
        except OSError as exc:
            self._log.write(f"cannot start: {exc}\n".encode())
            self._log.close()
            self.exit_code = 127
        finally:
            for fd in channels.values():
                os.close(fd)
        self.started_at = time.monotonic()
        if self.proc is not None:  # what the keeper names it by, should it fence it
            self.proc_start = process_start(self.proc.pid)

    def release(self, fenced: bool = False) -> None:
        """Let a gated start run its program; `fenced`: it never runs (the node's lease
        lapsed before its fence was in place) and ends as a fenced trial does."""
        gate = getattr(self.proc, "stdin", None)
        if fenced:
            self.fenced = True
        if gate is not None:
            try:
                if not fenced:
                    gate.write(b"go\n")
                gate.close()
            except OSError:  # it is gone already: its exit says so
                pass
        if fenced:
            self.kill()

    def give_workdir(self) -> None:
        """The work directory becomes the trial user's; the agent's directories above it
        become passable (0711), not listable."""
        assert self.account is not None
        self.account.own(self.workdir)
        if self.agent_dir:
            top = Path(self.agent_dir)
            for part in self.workdir.resolve().relative_to(top).parts[:-1]:
                os.chmod(top, PASSABLE)
                top = top / part
            os.chmod(top, PASSABLE)

    @property
    def held(self) -> bool:
        """Launched, and waiting for its warm process: no process yet."""
        return self.hold_until is not None and self.proc is None and self.exit_code is None

    def poll(self) -> int | None:
        if self.exit_code is not None:
            return self.exit_code
        if self.proc is None:
            assert self.held, "polled before it started"
            return None
        code = self.proc.poll()
        if code is None and self.killed_at is not None and \
                time.monotonic() - self.killed_at > KILL_GRACE_S:
            self._signal(signal.SIGKILL)
            signal_all(self._tree, signal.SIGKILL)
        if code is not None:
            # Whatever of its tree is left goes too (a child that ignored SIGTERM, or
            # one left behind by a trial that exited).
            signal_all([p for p in self._tree if p.pid != self.proc.pid], signal.SIGKILL)
            self.exit_code = code if code >= 0 else 128 - code
            if self._log is not None:
                self._log.close()
        return self.exit_code

    def kill(self) -> None:
        """SIGTERM the process group and every descendant (also those that left the
        group) now, SIGKILL after a grace period (in poll)."""
        if self.held:  # it never starts: it ends as a trial that SIGTERM stopped
            self.killed_at = time.monotonic()
            self.exit_code = 128 + signal.SIGTERM
            return
        if self.killed_at is None and self.exit_code is None:
            self.killed_at = time.monotonic()
            if self.proc is not None:
                self._tree = tree(self.proc.pid)
            self._signal(signal.SIGTERM)
            signal_all(self._tree, signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def pids(self, children: dict[int, list[int]] | None = None) -> list[int]:
        """The process and its descendants (a command may start the real trainer); they
        are remembered, so that what is left of them dies with the trial. `children`: a
        `children_map` taken for all the node's trials at once."""
        if self.proc is None or self.exit_code is not None:
            return []
        if children is None:
            procs = tree(self.proc.pid)
            pids, by_pid = [p.pid for p in procs], {p.pid: p for p in procs}
        else:
            pids, by_pid = tree_pids(self.proc.pid, children), {}
        known = {p.pid for p in self._tree}
        for pid in pids:
            if pid in known:
                continue
            proc = by_pid.get(pid)
            if proc is None:
                try:
                    proc = psutil.Process(pid)
                except psutil.Error:
                    continue  # gone meanwhile
            self._tree.append(proc)
            known.add(pid)
        return pids


def job_key(job_id: str, attempt: int) -> str:
    """A job's key, unique per attempt: `trial#attempt` (a profile run: its id)."""
    return f"{job_id}#{attempt}" if attempt else job_id


def node_dir(workdir: Path, node: str) -> Path:
    """A node's directory under the agent's work directory, never outside it."""
    return workdir / safe_part(node)


def job_dir(root: Path, group: str, job_id: str) -> Path:
    """A job's directory, always inside `root`: names are reduced to safe characters and
    never `.`, `..` or hidden."""
    return root / safe_part(group) / safe_part(job_id)


def safe_part(name: str) -> str:
    """A name as one path component: safe characters, never `.`, `..` or hidden."""
    part = _SAFE_NAME.sub("_", name)[:200]
    return "_" + part if not part or part.startswith(".") else part


def __getattr__(name: str) -> Any:
    """The fused group's parts, which lived here before agent/groups.py (which imports
    this module): imports from here keep working."""
    if name in ("MemberJob", "fused_argv", "fused_spec"):
        from hypersack.agent import groups
        return getattr(groups, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
