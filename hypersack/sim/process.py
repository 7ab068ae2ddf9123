"""A process of its own for the server's simulations (`OrchestratorConfig.foresight_pool`):
a study's first decision under `predict` hands its candidate rules' simulations here and
waits for them only briefly, so that the server's event worker, which every study's
exits and launches pass through, is never held for seconds by one study's choice, and
the simulations do not share the server's GIL.

One worker process (`python -m hypersack.sim.process`), started on first use and again
after it dies; calls run one at a time, in order. Requests and replies are pickles over
the worker's stdin and stdout: the worker is this process's own child and reads nothing
else, so nothing from outside is unpickled. A call whose worker dies fails (its caller
falls back); the next call starts a new worker. `shutdown` kills the worker at once: a
simulation under way is of no use to a server that stops.
"""

from __future__ import annotations

import collections
import logging
import os
import pickle
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)

_STOP = None  # what the feeder thread takes to end
# A call that runs longer is a wedged worker (a simulation's candidates stop after
# sim/foresight.BUDGET_S; loading the compiled knapsacks the first time takes about 9 s).
CALL_LIMIT_S = 120.0


class WorkerDied(RuntimeError):
    """The simulation process ended before it answered."""


class SimProcess(Executor):
    """`submit(fn, *args)` runs `fn(*args)` in the worker process (fn and args must
    pickle: module-level functions and plain data)."""

    def __init__(self, python: str = sys.executable, call_limit_s: float = CALL_LIMIT_S
                 ) -> None:
        self.python = python
        self.call_limit_s = call_limit_s
        self._busy_since = 0.0  # when the call the worker runs now began (monotonic)
        self._ready = False  # the worker said it is ready (its warm-up is not a call's)
        # Called (from the reader thread) after each call's answer or failure: the
        # server ticks then, to take the answer in at once.
        self.on_answer: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._waiting: collections.deque[Future[Any]] = collections.deque()
        self._feed: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._closed = False
        self.started = 0  # workers started (tests: a dead one is replaced)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        data = pickle.dumps((fn, args, kwargs))  # fails here, in the caller, if it cannot
        future: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the simulation process is shut down")
            if self._proc is None:
                self._start()
            if not self._waiting:
                self._busy_since = time.monotonic()
            self._waiting.append(future)
            self._feed.put(data)
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            self._closed = True
            proc, self._proc = self._proc, None
            self._feed.put(_STOP)
        if proc is not None:
            proc.kill()
            if wait:
                proc.wait()

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    def _start(self) -> None:
        # Under the lock. A new feed: the old feeder ends with its process.
        self._feed.put(_STOP)
        self._feed = queue.SimpleQueue()
        # The package's own folder first: the server may run from a source tree.
        home = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [home, *filter(None, [os.environ.get("PYTHONPATH")])])}
        # A session of its own: a terminal's Ctrl-C is the server's to handle.
        proc = subprocess.Popen([self.python, "-m", "hypersack.sim.process"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                                close_fds=True, start_new_session=True)
        self._proc = proc
        self._ready = False
        self.started += 1
        assert proc.stdin is not None and proc.stdout is not None
        threading.Thread(target=self._feeder, args=(proc.stdin, self._feed),
                         name="hypersack-sim-feed", daemon=True).start()
        threading.Thread(target=self._reader, args=(proc, proc.stdout),
                         name="hypersack-sim-read", daemon=True).start()
        threading.Thread(target=self._watch, args=(proc,), name="hypersack-sim-watch",
                         daemon=True).start()

    def _watch(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill a wedged worker: one call running past call_limit_s. Its calls fail
        (WorkerDied) and the next call starts another, so one stuck simulation does not
        leave every later study without its choice."""
        while proc.poll() is None:
            time.sleep(min(1.0, self.call_limit_s / 4))
            with self._lock:
                busy = self._proc is proc and self._ready and bool(self._waiting)
                running_s = time.monotonic() - self._busy_since
            if busy and running_s > self.call_limit_s:
                log.warning("the simulation process ran one call for %.0f s (limit %.0f s); "
                            "killed, and the next call starts another", running_s,
                            self.call_limit_s)
                proc.kill()
                return

    @staticmethod
    def _feeder(pipe: IO[bytes], feed: queue.SimpleQueue[bytes | None]) -> None:
        # Writes off the caller's thread: a request larger than the pipe's buffer
        # would otherwise hold the event worker until the worker reads it.
        while (data := feed.get()) is not None:
            try:
                pipe.write(data)
                pipe.flush()
            except (BrokenPipeError, OSError, ValueError):
                return  # the reader fails the calls
        pipe.close()

    def _reader(self, proc: subprocess.Popen[bytes], pipe: IO[bytes]) -> None:
        while True:
            try:
                ok, value = pickle.load(pipe)  # noqa: S301 - our own child's reply
            except Exception:  # EOF or a torn reply: the worker is gone
                break
            with self._lock:
                self._busy_since = time.monotonic()  # the next call, if any, begins
                if ok is None:  # the worker's first word: ready, its warm-up done
                    self._ready = True
                    continue
                future = self._waiting.popleft() if self._waiting else None
            if future is None:
                continue
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)
            self._answered()
        proc.wait()
        with self._lock:
            if self._proc is proc:
                self._proc = None
            failed, self._waiting = list(self._waiting), collections.deque()
        if failed and not self._closed:
            log.warning("the simulation process ended (exit %s) with %d call(s) unanswered",
                        proc.returncode, len(failed))
        for future in failed:
            future.set_exception(WorkerDied(f"the simulation process ended (exit "
                                            f"{proc.returncode}) before it answered"))
        if failed:
            self._answered()

    def _answered(self) -> None:
        if self.on_answer is not None:
            try:
                self.on_answer()
            except Exception:  # the caller's; the answer is in the future either way
                log.warning("the answer callback failed", exc_info=True)


def warm_simulations() -> bool:
    """What the worker does first, before it reads a call: the simulator imported, and
    pack's compiled knapsacks loaded (only where they run compiled are the rules that use them
    simulated; sim/foresight.PACKING)."""
    from hypersack.policies import kernels
    from hypersack.sim import foresight  # noqa: F401 - imported for the calls to come

    return kernels.compile_now()


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    replies.write(pickle.dumps((None, None)))  # ready: the calls' time limit starts now
    replies.flush()
    while True:
        try:
            fn, args, kwargs = pickle.load(requests)  # noqa: S301 - from our parent
        except EOFError:
            return
        try:
            data = pickle.dumps((True, fn(*args, **kwargs)))
        except Exception as exc:  # the caller decides what a failure means
            # As a RuntimeError naming it: every exception pickles, not every one
            # unpickles (one whose constructor takes other arguments).
            data = pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
        replies.write(data)
        replies.flush()


def main() -> None:
    # Replies go to the original stdout; anything printed goes to stderr (the server's
    # log), so that a stray print cannot tear a reply.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    logging.basicConfig(level=logging.WARNING,
                        format="%(asctime)s %(levelname)s simulation: %(message)s")
    try:
        warm_simulations()
    except Exception:  # the simulations then import and compile when first run
        logging.getLogger(__name__).warning("readying the simulations failed",
                                            exc_info=True)
    try:
        _serve(sys.stdin.buffer, replies)
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
