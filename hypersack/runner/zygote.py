"""The warm start: a process that has imported a trial's libraries once (torch, the SDK, a
program's declared `preload`) and forks each trial from that state, so a trial starts in
milliseconds instead of paying the imports (seconds for torch) every time.

The agent starts one per (Unix account, Python, preload list) with the clean environment
trials get, as the account trials run as (`hypersack.agent.warm`), and talks to it over a
Unix socket of SOCK_SEQPACKET (one message per datagram, descriptors passed with it):

    agent -> zygote  {"argv": [...], "env": {...}, "cwd": "...", "fds": [names]}
                     + descriptors: the log, then one per name (the trial's channels)
    zygote -> agent  {"ready": true, "failed": {module: error}}     once, at start
                     {"pid": N} | {"error": "..."}                    per request
                     {"exit": N, "code": C}                           per trial that ends

A trial is fenced from the moment it exists by the agent's keeper (hypersack.agent.fence),
which stops every process carrying the agent's mark in its environment once the lease
lapses, whatever the agent does meanwhile (it may be frozen right after it asked).

Each trial is a process of its own (fork): its own session and process group, a
parent-death signal (it dies with its zygote, which dies with the agent), standard
output and error to its log, standard input from /dev/null, only its channels open, its
environment and working directory, fresh random seeds (Python's, NumPy's and torch's
global generators), and the program run as `python script.py ARGS` or `python -m MODULE
ARGS` would run it, and ended as the interpreter ends it (its non-daemon threads
waited for, then its atexit functions; an uncaught exception through sys.excepthook, an
uncaught KeyboardInterrupt by SIGINT). A crash ends that process only. The zygote
itself runs no trial code and no thread of its own; it reaps its children and reports
their exit codes.

A leaf of the runner: of HyperSack it imports only the names of the trial's environment
and what it is asked to preload.
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
from typing import Any

from hypersack.core.trial_env import ENV_METRICS, ENV_METRICS_FD, ENV_PROFILE, ENV_PROFILE_FD

MAX_MESSAGE = 1 << 20  # bytes of one request (argv and environment)
MAX_FDS = 8
PR_SET_PDEATHSIG = 1
# What a trial's channel variables hold besides the descriptor's number: its path form.
PATH_FORMS = {ENV_METRICS_FD: ENV_METRICS, ENV_PROFILE_FD: ENV_PROFILE}


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    try:
        sock.send(json.dumps(message).encode())
    except OSError:
        pass  # the agent is gone: the loop sees its end


def _prctl_pdeathsig() -> None:
    try:
        name = ctypes.util.find_library("c")
        if name:
            ctypes.CDLL(name, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL),
                                                    0, 0, 0)
    except OSError:
        pass


# What a module imports lazily on first use, which a trial would otherwise pay for at
# its first step: torch's optimizers pull in torch._dynamo (about a second).
ALSO = {"torch": ("torch._dynamo",)}


def preload(modules: list[str]) -> dict[str, str]:
    """Import each module (and what it imports lazily, ALSO); what failed, with its error
    (the trial imports it again)."""
    failed: dict[str, str] = {}
    for name in [m for n in modules for m in (n, *ALSO.get(n, ()))]:
        try:
            importlib.import_module(name)
        except BaseException as exc:  # an import may raise anything, SystemExit too
            failed[name] = f"{type(exc).__name__}: {exc}"[:300]
    return failed


def _reseed() -> None:
    """Forked children share their parent's random state: each gets its own (Python's
    `random` reseeds itself after a fork)."""
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            np.random.seed()
        except Exception:  # noqa: S110 - a broken numpy is the program's to find
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            torch.seed()
        except Exception:  # noqa: S110
            pass


def _exit_code(code: object) -> int:
    """What sys.exit(code) makes the process's status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _run(argv: list[str]) -> None:
    """Run the program as the interpreter would: `python -m MODULE ARGS` or `python
    SCRIPT ARGS` (argv[0] is the interpreter)."""
    # sys.path[0] is the interpreter's own first entry (the warm process's: the folder it
    # started in), as `python -m` and `python SCRIPT` set it.
    if len(argv) >= 3 and argv[1] == "-m":
        sys.argv = [argv[2], *argv[3:]]
        sys.path[0] = os.getcwd()
        # Run as `python -m` runs it: once, as __main__. A preloaded copy under its own
        # name would make runpy warn in every trial's log ("found in sys.modules after
        # import of package ..."); what it imported stays loaded.
        sys.modules.pop(argv[2], None)
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        return
    script = argv[1]
    sys.argv = [script, *argv[2:]]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    runpy.run_path(script, run_name="__main__")


def _excepthook() -> None:
    """Report the exception being handled as an uncaught one is: through sys.excepthook,
    which the program may have set."""
    try:
        sys.excepthook(*sys.exc_info())
    except BaseException:
        traceback.print_exc()


def _finalize() -> None:
    """What the interpreter does at its end, in its order: wait for the program's
    non-daemon threads (a background writer a cold run would let finish), then run the
    atexit functions. The caller flushes and leaves with os._exit."""
    try:
        threading._shutdown()  # type: ignore[attr-defined]
    except BaseException:
        traceback.print_exc()
    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked trial: become its own process and run the program; never returns."""
    code = 1
    try:
        os.setsid()
        _prctl_pdeathsig()
        signal.set_wakeup_fd(-1)
        # As a new interpreter sets them: SIGPIPE and SIGXFSZ ignored (writes raise
        # instead), SIGINT a KeyboardInterrupt, the rest their default.
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        log, channels = fds[0], fds[1:]
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        keep = {0, 1, 2, *channels}
        for name in os.listdir("/proc/self/fd"):  # the zygote's socket, pipes, logs...
            if int(name) not in keep:
                try:
                    os.close(int(name))
                except OSError:
                    pass
        env = {str(k): str(v) for k, v in request["env"].items()}
        for name, fd in zip(request.get("fds", []), channels, strict=False):
            os.set_inheritable(fd, True)
            env[name] = str(fd)
            if PATH_FORMS.get(name) in env:
                env[PATH_FORMS[name]] = f"/dev/fd/{fd}"
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        _reseed()
        sdk = sys.modules.get("hypersack.runner.sdk")
        if sdk is not None:
            sdk._after_fork()
        argv = [str(a) for a in request["argv"]]
        sys.orig_argv = argv  # the command as given, not the warm process's
        interrupted = False
        try:
            _run(argv)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc.code)
        except BaseException as exc:
            interrupted = isinstance(exc, KeyboardInterrupt)
            _excepthook()
            code = 1
        _finalize()
        if interrupted:
            # As the interpreter ends on an uncaught KeyboardInterrupt: killed by SIGINT.
            sys.stdout.flush()
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def serve(sock: socket.socket) -> None:
    """Fork a trial for each request until the agent closes the socket; report every
    child's exit. Then stop every child left (SIGKILL to its group) and end."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: set[int] = set()
    try:
        while True:
            readable, _, _ = select.select([sock.fileno(), wake_r], [], [], 1.0)
            if wake_r in readable:
                os.read(wake_r, 4096)
            _reap(sock, children)
            if sock.fileno() not in readable:
                continue
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
            except OSError:
                return
            if not data:
                return
            try:
                request = json.loads(data)
                if not fds or not isinstance(request.get("argv"), list) or \
                        not isinstance(request.get("env"), dict):
                    raise ValueError("a request needs argv, env and a log descriptor")
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
            except (ValueError, OSError) as exc:
                for fd in fds:
                    os.close(fd)
                _send(sock, {"error": str(exc)[:300]})
                continue
            if pid == 0:
                _child(request, fds)
            for fd in fds:
                os.close(fd)
            children.add(pid)
            _send(sock, {"pid": pid})
    finally:
        for pid in children:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass


def _reap(sock: socket.socket, children: set[int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid not in children:
            continue  # not one of the trials
        children.discard(pid)
        _send(sock, {"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def main() -> None:
    """`python -m hypersack.runner.zygote FD MODULES_JSON`: FD is the socket to the agent."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    modules = json.loads(sys.argv[2]) if len(sys.argv) > 2 else []
    failed = preload([str(m) for m in modules])
    _send(sock, {"ready": True, "failed": failed})
    serve(sock)


if __name__ == "__main__":
    main()
