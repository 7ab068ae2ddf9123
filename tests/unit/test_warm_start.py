"""Warm starts (issue 37, 4): trials forked from a process that preloaded their libraries
run exactly as `python SCRIPT` or `python -m MODULE` would (their argv, environment,
directory, descriptors, session, exit code, fresh random seeds), a crash touches no
other trial, the launcher tracks and kills them as cold ones, and whatever cannot be
forked starts cold."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import patch

import psutil
import pytest

from hypersack.agent.launcher import Job, preload_of
from hypersack.agent.warm import MAX_STILLBORN, Warm, WarmPool, WarmProcess, forkable
from hypersack.grid.space import Program
from hypersack.testing.cluster import wait_for

PROBE = """
import json, os, random, sys
import numpy as np
out = {"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ), "pid": os.getpid(),
       "sid": os.getsid(0), "pgid": os.getpgid(0), "fds": sorted(int(f) for f in
       os.listdir("/proc/self/fd")), "stdin": os.readlink("/proc/self/fd/0"),
       "name": __name__, "random": random.random(), "np": float(np.random.rand())}
print(json.dumps(out), flush=True)
print("to stderr", file=sys.stderr, flush=True)
code = os.environ.get("EXIT")
if code == "raise":
    raise RuntimeError("boom")
if code == "segv":
    os.kill(os.getpid(), 11)
if code == "sleep":
    import time
    time.sleep(60)
sys.exit(int(code or 0))
"""


@pytest.fixture
def pool(tmp_path: Path) -> Iterator[WarmPool]:
    p = WarmPool(tmp_path / "warm", str(tmp_path), None)
    try:
        yield p
    finally:
        p.close()


def ready(pool: WarmPool, argv: list[str], log: int, preload: tuple[str, ...] = ("numpy",)
          ) -> None:
    """Start the pool's warm process (the first request of a kind starts cold)."""
    assert pool.spawn(argv, {}, Path("/"), log, {}, None, preload) is None
    assert pool.wait_ready(60)


def run(pool: WarmPool, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path,
        channels: dict[str, int] | None = None) -> tuple[WarmProcess, dict]:
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = pool.spawn(argv, env, cwd, log, channels or {}, None, ("numpy",))
    finally:
        os.close(log)
    assert proc is not None
    proc.wait(30)
    first = log_path.read_text().splitlines()[0]
    return proc, json.loads(first)


def test_what_can_be_forked() -> None:
    py = sys.executable
    assert forkable([py, "train.py", "--lr", "1"])
    assert forkable([py, "-m", "pkg.train", "x"])
    assert not forkable([py])
    assert not forkable([py, "-m"])
    assert not forkable([py, "-u", "train.py"])  # interpreter options: cold
    assert not forkable([py, "-m", "-c"])
    assert not forkable(["/usr/bin/python3.99", "train.py"])  # another interpreter
    assert not forkable(["/bin/echo", "hi"])
    assert preload_of(Program(builtin="sleep")) == ("hypersack.runner.sdk",
                                                    "hypersack.runner.sleep")
    assert preload_of(Program(command="{python} t.py", preload=["torch", "numpy"])) == (
        "hypersack.runner.sdk", "torch", "numpy")


def test_a_forked_trial_runs_as_the_interpreter_would(pool: WarmPool, tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    work = tmp_path / "work"
    work.mkdir()
    argv = [sys.executable, str(script), "--lr", "0.1"]
    log = tmp_path / "log.txt"
    ready(pool, argv, os.open(tmp_path / "first.txt", os.O_WRONLY | os.O_CREAT, 0o600))
    metrics = os.open(tmp_path / "metrics.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                      0o600)
    env = {"PATH": "/usr/bin:/bin", "ONLY_THIS": "1", "EXIT": "3",
           "HYPERSACK_METRICS_FD": str(metrics), "HYPERSACK_METRICS_FILE": "/dev/fd/99"}
    proc, out = run(pool, argv, env, work, log, {"HYPERSACK_METRICS_FD": metrics})
    os.close(metrics)
    assert proc.returncode == 3
    assert out["argv"] == [str(script), "--lr", "0.1"] and out["name"] == "__main__"
    assert out["cwd"] == str(work)
    fd = int(out["env"]["HYPERSACK_METRICS_FD"])
    # Its environment is the one given (the descriptor renumbered), nothing of the warm
    # process's own.
    assert out["env"] == {**env, "HYPERSACK_METRICS_FD": str(fd),
                          "HYPERSACK_METRICS_FILE": f"/dev/fd/{fd}"}
    assert out["fds"][:3] == [0, 1, 2] and fd in out["fds"]
    assert len(out["fds"]) <= 5  # 0, 1, 2, its channel (and the listing's own)
    assert out["stdin"] == "/dev/null"
    assert out["sid"] == out["pid"] == out["pgid"] == proc.pid  # its own session and group
    assert "to stderr" in log.read_text()


def test_the_channel_descriptor_reaches_the_sdk(pool: WarmPool, tmp_path: Path) -> None:
    script = tmp_path / "report.py"
    script.write_text("from hypersack.runner import sdk\nsdk.report(step=1, loss=0.5)\n"
                      "import json, os\nprint(json.dumps({}))\n")
    argv = [sys.executable, str(script)]
    ready(pool, argv, os.open(tmp_path / "first.txt", os.O_WRONLY | os.O_CREAT, 0o600))
    path = tmp_path / "metrics.jsonl"
    metrics = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    proc, _ = run(pool, argv, {"HYPERSACK_METRICS_FD": str(metrics)}, tmp_path,
                  tmp_path / "log.txt", {"HYPERSACK_METRICS_FD": metrics})
    os.close(metrics)
    assert proc.returncode == 0
    line = json.loads(path.read_text().splitlines()[0])
    assert line["step"] == 1 and line["metrics"] == {"loss": 0.5}


def test_each_trial_has_its_own_random_state_and_a_crash_is_its_own(pool: WarmPool,
                                                                   tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    argv = [sys.executable, str(script)]
    ready(pool, argv, os.open(tmp_path / "first.txt", os.O_WRONLY | os.O_CREAT, 0o600))
    seen = []
    for i, exit_as in enumerate(["0", "segv", "raise", "0"]):
        proc, out = run(pool, argv, {"EXIT": exit_as}, tmp_path, tmp_path / f"log{i}.txt")
        seen.append((out["random"], out["np"]))
        assert proc.returncode == {"0": 0, "segv": -11, "raise": 1}[exit_as]
    assert "RuntimeError: boom" in (tmp_path / "log2.txt").read_text()
    assert len({r for r, _ in seen}) == 4 and len({n for _, n in seen}) == 4


def test_a_relative_directory_is_the_agents(pool: WarmPool, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`hypersack run`'s default state directory is relative (.hypersack): a trial's
    directory is then relative to the agent's, as a cold start's is."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    (tmp_path / "rel" / "work").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "rel")
    argv = [sys.executable, str(script)]
    ready(pool, argv, os.open(tmp_path / "first.txt", os.O_WRONLY | os.O_CREAT, 0o600))
    proc, out = run(pool, argv, {}, Path("work"), tmp_path / "log.txt")
    assert proc.returncode == 0 and out["cwd"] == str(tmp_path / "rel" / "work")


SAME = """
import json, signal, sys
print(json.dumps({"path0": sys.path[0], "argv": sys.argv, "name": __name__,
                  "signals": {s: str(signal.getsignal(getattr(signal, s))) for s in
                              ("SIGPIPE", "SIGXFSZ", "SIGINT", "SIGTERM", "SIGCHLD")}}))
"""


def test_a_warm_trial_sees_what_a_cold_one_sees(pool: WarmPool, tmp_path: Path) -> None:
    """The same program started cold and warm: its sys.path[0], argv, __name__ and
    signal dispositions agree (a new interpreter ignores SIGPIPE, for one)."""
    (tmp_path / "sub").mkdir()
    script = tmp_path / "sub" / "same.py"
    script.write_text(SAME)
    argv = [sys.executable, str(script), "x"]
    cold = json.loads(subprocess.run(argv, capture_output=True, text=True, cwd=tmp_path,
                                     check=True).stdout)
    ready(pool, argv, os.open(tmp_path / "first.txt", os.O_WRONLY | os.O_CREAT, 0o600))
    proc, warm = run(pool, argv, {}, tmp_path, tmp_path / "log.txt")
    assert proc.returncode == 0
    assert warm == cold


ENDING = """
import os, sys, threading, time
def late():
    time.sleep(0.3)  # still running when the program's main code has ended
    print("late", sys.orig_argv[1:], flush=True)
threading.Thread(target=late).start()
sys.excepthook = lambda kind, exc, tb: print("hooked", kind.__name__, exc)
print("unflushed")
how = sys.argv[1]
if how == "interrupt":
    raise KeyboardInterrupt
if how == "raise":
    raise ValueError("v")
sys.exit("a message")
"""


@pytest.mark.parametrize("how", ["exit", "raise", "interrupt"])
def test_a_warm_trial_ends_as_a_cold_one(pool: WarmPool, tmp_path: Path, how: str) -> None:
    """How the interpreter ends a program: its non-daemon threads finish before the
    process ends, an uncaught exception goes through sys.excepthook (which the program
    may set), an uncaught KeyboardInterrupt ends it by SIGINT; sys.orig_argv is its
    command. The same program warm and cold: the same output and exit status."""
    script = tmp_path / "ending.py"
    script.write_text(ENDING)
    argv = [sys.executable, str(script), how]
    cold = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          cwd=tmp_path)
    ready(pool, argv, os.open(tmp_path / "first.txt", os.O_WRONLY | os.O_CREAT, 0o600))
    log_path = tmp_path / "log.txt"
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = pool.spawn(argv, {}, tmp_path, log, {}, None, ("numpy",))
    finally:
        os.close(log)
    assert proc is not None
    assert proc.wait(30) == cold.returncode == {"exit": 1, "raise": 1,
                                                "interrupt": -signal.SIGINT}[how]
    assert "late" in cold.stdout
    assert sorted(log_path.read_text().splitlines()) == sorted(cold.stdout.splitlines())


def test_a_module_runs_as_python_dash_m(pool: WarmPool, tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "main.py").write_text(PROBE)
    argv = [sys.executable, "-m", "mypkg.main", "x"]
    ready(pool, argv, os.open(tmp_path / "first.txt", os.O_WRONLY | os.O_CREAT, 0o600))
    proc, out = run(pool, argv, {}, tmp_path, tmp_path / "log.txt")  # found from its cwd
    assert proc.returncode == 0 and out["name"] == "__main__"
    assert out["argv"][0].endswith("mypkg/main.py") and out["argv"][1:] == ["x"]



def test_a_preloaded_module_run_with_dash_m_says_what_a_cold_run_says(
        pool: WarmPool, tmp_path: Path) -> None:
    """The module a trial runs may be preloaded under its own name (the built-in
    programs are): it is still run once, as __main__, and its log is a cold run's
    (runpy warned in every trial's log that it found the module already imported)."""
    argv = [sys.executable, "-m", "json.tool"]  # reads an empty stdin: fails, exit 1
    cold = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    ready(pool, argv, os.open(tmp_path / "first.txt", os.O_WRONLY | os.O_CREAT, 0o600),
          preload=("json.tool",))
    log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        proc = pool.spawn(argv, {}, tmp_path, log, {}, None, ("json.tool",))
    finally:
        os.close(log)
    assert proc is not None and proc.wait(30) == cold.returncode == 1
    assert (tmp_path / "log.txt").read_text() == cold.stdout


def job(tmp_path: Path, pool: WarmPool, argv: list[str], env: dict[str, str]) -> Job:
    return Job("t1", 0, tmp_path / "t1" / "attempt-1", argv, env, attempt=1,
               agent_dir=str(tmp_path), warm=pool, preload=("numpy",))


def test_the_launcher_starts_warm_tracks_and_kills(pool: WarmPool, tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    argv = [sys.executable, str(script)]
    first = job(tmp_path, pool, argv, {"EXIT": "0"})
    first.start()
    assert not isinstance(first.proc, WarmProcess)  # the first of its kind: cold
    assert pool.wait_ready(60)
    while first.poll() is None:
        time.sleep(0.02)
    sleeper = job(tmp_path, pool, argv, {"EXIT": "sleep"})
    sleeper.start()
    assert isinstance(sleeper.proc, WarmProcess)
    for _ in range(200):
        if sleeper.pids():
            break
        time.sleep(0.01)
    sleeper.kill()  # SIGTERM to its group
    for _ in range(500):
        if sleeper.poll() is not None:
            break
        time.sleep(0.02)
    assert sleeper.poll() == 128 + signal.SIGTERM
    out = json.loads(sleeper.log_path.read_text().splitlines()[1])  # after "$ argv"
    assert out["env"]["HYPERSACK_JOB"] == sleeper.key  # its own marker for its children
    assert out["cwd"] == str(sleeper.workdir)


def test_when_the_warm_process_dies_trials_start_cold_and_it_is_replaced(
        pool: WarmPool, tmp_path: Path) -> None:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    argv = [sys.executable, str(script)]
    ready(pool, argv, os.open(tmp_path / "first.txt", os.O_WRONLY | os.O_CREAT, 0o600))
    warm = pool.processes()[0]
    os.kill(warm.proc.pid, signal.SIGKILL)
    warm.proc.wait(10)
    for _ in range(200):
        if warm.dead:
            break
        time.sleep(0.01)
    log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    assert pool.spawn(argv, {}, tmp_path, log, {}, None, ("numpy",)) is None  # cold
    assert pool.wait_ready(60)
    proc = pool.spawn(argv, {}, tmp_path, log, {}, None, ("numpy",))
    os.close(log)
    assert proc is not None and proc.wait(30) == 0


def test_what_cannot_be_forked_starts_cold(pool: WarmPool, tmp_path: Path) -> None:
    log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    assert pool.spawn(["/bin/echo", "hi"], {}, tmp_path, log, {}, None, ()) is None
    assert pool.spawn([sys.executable, "-c", "1"], {}, tmp_path, log, {}, None, ()) is None
    off = WarmPool(tmp_path / "w2", str(tmp_path), None, enabled=False)
    assert off.spawn([sys.executable, "x.py"], {}, tmp_path, log, {}, None, ()) is None
    assert not pool.processes() and not off.processes()  # nothing started for them
    os.close(log)


def test_a_failed_preload_is_said_and_the_trial_imports_it_itself(pool: WarmPool,
                                                                  tmp_path: Path) -> None:
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    argv = [sys.executable, str(script)]
    log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    assert pool.spawn(argv, {}, tmp_path, log, {}, None, ("no_such_module_xyz",)) is None
    assert pool.wait_ready(60)
    warm = pool.processes()[0]
    assert "no_such_module_xyz" in warm.failed
    proc = pool.spawn(argv, {}, tmp_path, log, {}, None, ("no_such_module_xyz",))
    os.close(log)
    assert proc is not None and proc.wait(30) == 0
    assert "ran" in (tmp_path / "log.txt").read_text()


def test_what_a_warm_process_says_is_checked(tmp_path: Path) -> None:
    """The warm process runs the account's code (its preloads), so its messages are
    input like any other: garbage is skipped, exits of processes it did not fork for us
    are ignored, and a pid that is not its child is refused (the agent would signal it)."""
    import socket
    import threading

    from hypersack.agent.warm import Warm

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    fake = subprocess.Popen(["sleep", "30"])  # stands for the warm process
    warm = Warm((None, ()), fake, ours)
    reader = threading.Thread(target=warm.read, daemon=True)
    reader.start()
    try:
        for junk in (b"{", b"[1, 2]", b'{"exit": "x", "code": 1}', b'{"exit": 5}',
                     b'{"ready": true, "failed": [1]}', b'{"exit": 99999999, "code": 1}'):
            theirs.send(junk)
        theirs.send(b'{"ready": true, "failed": {}}')
        theirs.send(json.dumps({"pid": 4242}).encode())
        theirs.send(json.dumps({"exit": 4242, "code": 10**9}).encode())
        for _ in range(200):
            if warm.exits:
                break
            time.sleep(0.01)
        assert warm.ready and warm.exits == {4242: 255}  # clamped; the junk changed nothing
        assert 99999999 not in warm.exits

        def forged(pid: int) -> WarmProcess | None:
            answer = threading.Thread(target=lambda: (socket.recv_fds(theirs, 1 << 20, 8),
                                                      theirs.send(json.dumps(
                                                          {"pid": pid}).encode())))
            answer.start()
            log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                return warm.spawn([sys.executable, "x.py"], {}, tmp_path, log, {})
            finally:
                os.close(log)
                answer.join(10)

        assert forged(os.getpid()) is None  # alive, and not the warm process's child
        assert forged(1) is None
        assert os.getpid() not in warm.children
    finally:
        theirs.close()
        reader.join(10)
        fake.kill()
        fake.wait()
    assert warm.dead


def test_the_keeper_fences_a_warm_trial_the_agent_never_saw(pool: WarmPool,
                                                            tmp_path: Path) -> None:
    """A trial forked by the warm process is fenced from the moment it exists, by the
    agent's keeper (agent.fence), which looks for the agent's mark, not for pids the
    agent passed on: an agent frozen right after asking (SIGSTOP) cannot leave a trial
    running past its lease while the server runs it elsewhere. Here the lease lapses
    and the agent does nothing more."""
    from hypersack.agent.fence import Lease, fenced_mark, keeper_argv, process_start

    lease = Lease(tmp_path / "lease", grace_s=0.5)
    lease.renew(time.monotonic() + 2.0)  # lapses in two seconds
    fenced = tmp_path / "fenced"
    fenced.mkdir()
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    argv = [sys.executable, str(script)]
    ready(pool, argv, os.open(tmp_path / "first.txt", os.O_WRONLY | os.O_CREAT, 0o600))
    keeper = subprocess.Popen(keeper_argv(lease.path, str(tmp_path), fenced),
                              start_new_session=True)
    work = tmp_path / "trial"
    work.mkdir()
    log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    marked = {"EXIT": "sleep", "HYPERSACK_AGENT_DIR": str(tmp_path), "HYPERSACK_JOB": "t1#1"}
    try:
        proc = pool.spawn(argv, marked, work, log, {}, None, ("numpy",))
        assert proc is not None
        start = process_start(proc.pid)
        started = time.monotonic()
        code = proc.wait(30)  # the sleep would take 60 s
        assert code in (-signal.SIGTERM, -signal.SIGKILL)
        assert time.monotonic() - started < 20
        mark = fenced_mark(fenced, proc.pid, start)
        assert mark is not None and mark.exists()
        assert not pool_exits_unclaimed(pool)
    finally:
        os.close(log)
        keeper.kill()
        keeper.wait()


def pool_exits_unclaimed(pool: WarmPool) -> list[int]:
    """Exits the warm processes reported for pids they were not asked to fork."""
    return [pid for warm in pool._pools.values() for pid in warm.exits
            if pid not in warm.children]


def test_the_first_trials_of_a_kind_wait_for_their_warm_process(tmp_path: Path) -> None:
    """Started with the first launch of its kind, the warm process is waited for (a cold
    start imports the same modules), so the trials launched with it fork. The pool only
    says until when (`ready_by`), at once: the agent holds the launch and goes on. One
    that does not get ready in time is waited for once, and trials start cold after."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    argv = [sys.executable, str(script)]
    waiting = WarmPool(tmp_path / "w1", str(tmp_path), None, wait_s=60)
    slow = tmp_path / "slowmod.py"
    slow.write_text("import time\ntime.sleep(8)\n")
    hung = WarmPool(tmp_path / "w2", str(tmp_path), {"PYTHONPATH": str(tmp_path)},
                    wait_s=0.5)
    try:
        log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT, 0o600)
        began = time.monotonic()
        until = waiting.ready_by(argv, None, ("numpy",))
        assert until is not None and until >= began + 59
        assert time.monotonic() - began < 30  # told, not made to wait (60 s)
        assert waiting.wait_ready(60)
        assert waiting.ready_by(argv, None, ("numpy",)) is None  # ready: no wait
        first = waiting.spawn(argv, {}, tmp_path, log, {}, None, ("numpy",))
        assert isinstance(first, WarmProcess) and first.wait(30) == 0
        assert len(waiting.processes()) == 1  # the one started for the first launch
        assert hung.ready_by(argv, None, ("slowmod",)) is not None
        assert hung.spawn(argv, {}, tmp_path, log, {}, None, ("slowmod",)) is None
        time.sleep(0.6)
        assert hung.ready_by(argv, None, ("slowmod",)) is None  # waited for once
        assert hung.spawn(argv, {}, tmp_path, log, {}, None, ("slowmod",)) is None
        assert len(hung.processes()) == 1
        os.close(log)
    finally:
        waiting.close()
        hung.close()


def _stopped_when_ready(tmp_path: Path, argv: list[str]) -> tuple[WarmPool, Warm, int]:
    """A pool whose warm process for `argv` got ready and was then stopped (SIGSTOP),
    and a log descriptor for its trials."""
    pool = WarmPool(tmp_path / "w", str(tmp_path), None, wait_s=60)
    log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    pool.ready_by(argv, None, ())
    assert pool.wait_ready(60)
    (warm,) = pool.processes()
    os.kill(warm.proc.pid, signal.SIGSTOP)
    return pool, warm, log


def test_a_warm_process_that_stops_answering_is_asked_once(tmp_path: Path) -> None:
    """A warm process runs its account's code, and a trial of that account may stop it
    (SIGSTOP): a fork request it leaves unanswered costs one wait, then its kind starts
    cold at once instead of each launch waiting for it."""
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    argv = [sys.executable, str(script)]
    pool, warm, log = _stopped_when_ready(tmp_path, argv)
    sent: list[object] = []
    send = socket.send_fds

    def counted(*args: object, **kwargs: object) -> object:
        sent.append(args)
        return send(*args, **kwargs)  # type: ignore[arg-type]

    try:
        with patch("hypersack.agent.warm.SPAWN_TIMEOUT_S", 0.5), \
                patch("hypersack.agent.warm.socket.send_fds", counted):
            assert pool.spawn(argv, {}, tmp_path, log, {}, None, ()) is None
            assert len(sent) == 1
            assert pool.spawn(argv, {}, tmp_path, log, {}, None, ()) is None
            assert pool.ready_by(argv, None, ()) is None
            assert len(sent) == 1  # not asked again
    finally:
        os.kill(warm.proc.pid, signal.SIGCONT)
        os.close(log)
        pool.close()


def test_a_kind_whose_warm_process_keeps_dying_starts_cold(tmp_path: Path) -> None:
    """A preload that kills the interpreter: after MAX_STILLBORN warm processes that died
    before they were ready, that kind of trial starts cold without starting another (each
    would cost the trial its wait and the node the imports), other kinds still warm."""
    (tmp_path / "crasher.py").write_text("import os\nos._exit(7)\n")
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    argv = [sys.executable, str(script)]
    pool = WarmPool(tmp_path / "w", str(tmp_path), {"PYTHONPATH": str(tmp_path)}, wait_s=30)
    started: list[Warm] = []
    start = pool._start

    def counted(key: tuple[int | None, tuple[str, ...]], account: object) -> Warm | None:
        warm = start(key, None)
        if warm is not None:
            started.append(warm)
        return warm

    pool._start = counted  # type: ignore[method-assign]
    log = os.open(tmp_path / "log.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for _ in range(MAX_STILLBORN + 3):
            # Each launch is held for its warm process, which dies: it starts cold.
            pool.ready_by(argv, None, ("crasher",))
            wait_for("the warm process to die",
                     lambda: all(w.dead for w in pool.processes()), 30, 0.05)
            assert pool.spawn(argv, {}, tmp_path, log, {}, None, ("crasher",)) is None
        assert len(started) == MAX_STILLBORN
        assert pool.ready_by(argv, None, ("crasher",)) is None  # given up: no wait
        assert all(w.proc.wait(10) == 7 for w in started)
        assert pool.ready_by(argv, None, ("json",)) is not None  # another kind: warm
        assert pool.wait_ready(30)
        proc = pool.spawn(argv, {}, tmp_path, log, {}, None, ("json",))
        assert proc is not None and proc.wait(30) == 0  # it forks
        assert len(started) == MAX_STILLBORN + 1
    finally:
        os.close(log)
        pool.close()


def test_a_fork_answered_after_the_agent_gave_up_on_it_is_killed(tmp_path: Path) -> None:
    """A warm process too slow to answer (stopped, then resumed): the agent started that
    trial cold, so the trial the warm process forks late must not run beside it."""
    marker = tmp_path / "ran.txt"
    script = tmp_path / "late.py"
    script.write_text(f"import time\ntime.sleep(20)\nopen({str(marker)!r}, 'w').write('ran')\n")
    argv = [sys.executable, str(script)]
    late: list[int] = []
    kill_late = Warm._kill_late

    def recorded(self: Warm, pid: int) -> None:
        kill_late(self, pid)
        late.append(pid)

    pool, warm, log = _stopped_when_ready(tmp_path, argv)
    try:
        with patch("hypersack.agent.warm.SPAWN_TIMEOUT_S", 0.3), \
                patch.object(Warm, "_kill_late", recorded):
            assert pool.spawn(argv, {}, tmp_path, log, {}, None, ()) is None  # gave up
            os.kill(warm.proc.pid, signal.SIGCONT)  # it reads the request and forks now
            wait_for("the late fork's answer", lambda: bool(late), 30, 0.05)
        (pid,) = late

        def gone() -> bool:
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        wait_for("the late fork to be killed", gone, 30, 0.05)
        assert not marker.exists() and not warm.children  # not taken for one of ours
    finally:
        os.kill(warm.proc.pid, signal.SIGCONT)
        os.close(log)
        pool.close()
