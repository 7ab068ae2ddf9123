"""The trial-side SDK: `hypersack.report(step=..., **metrics)` and profiling hooks.

A trial program talks to its agent through files named in its environment, so it
needs no network and nothing is lost if the agent reconnects meanwhile:

- `report()` appends one JSON line to `$HYPERSACK_METRICS_FILE`; the agent forwards
  the values to the server, and the last value of each metric is the trial's result.
- `iteration()` marks one training iteration. In a profile run (the agent sets
  `$HYPERSACK_PROFILE_FILE`), it times the iterations after the warm-up ones and,
  once enough are measured, writes seconds per iteration, the share spent loading
  data and the iterations per epoch to that file and ends the process (exit 0). A
  program that ends first is measured on what it ran. In a trial's own run, each
  `report()` carries the median seconds per iteration since the last one (how much
  sharing its GPU slows it down, which the server learns its packing from).
- `out_of_memory()` ends the process with the exit code the agent reports as an
  out-of-memory death, so the scheduler retries with a larger memory demand.
- Early stopping: `checkpoint_dir()` is a folder that every attempt of the trial on this
  node finds again; `should_stop()` turns true once the trial reported the epoch its
  pruner ranks it at. A program that saves a checkpoint there and exits (code 0) when
  `should_stop()` says so, and resumes from the checkpoint when it finds one, is paused
  at each rung and resumed when promoted, instead of training from the start.
"""

from __future__ import annotations

import atexit
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from hypersack.core.trial_env import (  # noqa: F401  (the SDK's names for them)
    ENV_CHECKPOINT_DIR,
    ENV_EPOCHS,
    ENV_METRICS,
    ENV_METRICS_FD,
    ENV_OPTIONS,
    ENV_PARAMS,
    ENV_PROFILE,
    ENV_PROFILE_FD,
    ENV_PROFILE_ITERATIONS,
    ENV_PROFILE_WARMUP,
    ENV_STOP_AT_EPOCH,
    ENV_STUDY_ID,
    ENV_TRIAL_ID,
    OOM_EXIT_CODE,
)


def params() -> dict[str, Any]:
    """The trial's hyperparameters (model, batch_size, lr, ...)."""
    raw = os.environ.get(ENV_PARAMS, "{}")
    value = json.loads(raw)
    return value if isinstance(value, dict) else {}


def options() -> dict[str, Any]:
    value = json.loads(os.environ.get(ENV_OPTIONS, "{}"))
    return value if isinstance(value, dict) else {}


def epochs(default: float = 1.0) -> float:
    return float(os.environ.get(ENV_EPOCHS, default))


_reported = {"step": 0}  # the last epoch reported

MAX_TIMED = 1024  # iteration ends a report window keeps (the latest)


class _Timing:
    """Outside a profile run: the ends of the iterations marked since the last report,
    so that each report says the seconds per iteration the trial sees (the server
    compares them with its solo profile: how much sharing its GPU slows it down)."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def mark(self) -> None:
        self.marks.append(time.perf_counter())
        if len(self.marks) > 2 * MAX_TIMED:
            del self.marks[:-MAX_TIMED]

    def take(self) -> dict[str, float]:
        """The median seconds per iteration since the last report, and the window they
        span; the last mark starts the next window."""
        marks = self.marks[-MAX_TIMED:]
        self.marks = marks[-1:]
        if len(marks) < 2:
            return {}
        times = [b - a for a, b in itertools.pairwise(marks)]
        return {"iter_s": statistics.median(times), "iter_window_s": marks[-1] - marks[0]}


_timing = _Timing()


def report(step: int | None = None, **metrics: float) -> None:
    """Send metrics to the agent. Call it once per epoch (or more often); `step`: the
    epoch just ended (the pruner ranks trials on the objective at given epochs)."""
    if step is not None:
        _reported["step"] = step
    path = os.environ.get(ENV_METRICS)
    values = {k: float(v) for k, v in metrics.items()}
    line = json.dumps({"t": time.time(), "step": step, "metrics": values,
                       **_timing.take()})
    fd = _inherited(ENV_METRICS_FD)
    if fd is not None:  # the agent's channel: one write, appended whole
        _write_all(fd, (line + "\n").encode())
        return
    if path is None:
        print(f"hypersack.report: {line}", file=sys.stderr)
        return
    with open(path, "a") as f:
        f.write(line + "\n")


def _inherited(name: str) -> int | None:
    """A descriptor the agent passed (its number in `name`), if it is open here."""
    text = os.environ.get(name, "")
    if not text.isdigit() or len(text) > 6:
        return None
    try:
        os.fstat(int(text))
    except OSError:
        return None
    return int(text)


def _write_all(fd: int, data: bytes, at: int | None = None) -> None:
    view = memoryview(data)
    offset = 0
    while offset < len(view):
        if at is None:
            offset += os.write(fd, view[offset:])
        else:
            offset += os.pwrite(fd, view[offset:], at + offset)


def checkpoint_dir() -> Path | None:
    """The folder to keep this trial's checkpoint in, found again by every attempt of the
    trial on this node (None when not run by an agent)."""
    value = os.environ.get(ENV_CHECKPOINT_DIR)
    if not value:
        return None
    path = Path(value)
    path.mkdir(parents=True, exist_ok=True)
    return path


def checkpoint_file(folder: Path, suffix: str) -> Path:
    """The checkpoint file `checkpoint<suffix>` in a trial's checkpoint folder."""
    return folder / f"checkpoint{suffix}"


def checkpoint_path(suffix: str) -> Path | None:
    """The file `checkpoint<suffix>` in `checkpoint_dir()` (None when not run by an
    agent)."""
    folder = checkpoint_dir()
    return None if folder is None else checkpoint_file(folder, suffix)


def save_checkpoint(suffix: str, write: Callable[[Path], Any]) -> None:
    """Write `checkpoint_path(suffix)` whole or not at all (see `write_whole`)."""
    path = checkpoint_path(suffix)
    if path is not None:
        write_whole(path, write)


def write_whole(path: Path, write: Callable[[Path], Any]) -> None:
    """`write(tmp)` writes a temporary file, which is then renamed over `path`: a
    checkpoint is there whole or not at all."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)
    print(f"checkpoint saved: {path}", flush=True)


def stop_at_epoch() -> float | None:
    """The epoch this attempt stops at to be ranked by the pruner (None: its last)."""
    value = os.environ.get(ENV_STOP_AT_EPOCH)
    try:
        stop = float(value) if value else 0.0
    except ValueError:
        return None
    return stop if math.isfinite(stop) and stop > 0 else None


def should_stop(epoch: int | None = None) -> bool:
    """Whether the trial should save its checkpoint and exit (code 0) now: it reached
    (`epoch`, default: the last epoch it reported) the rung its pruner ranks it at."""
    stop = stop_at_epoch()
    done = _reported["step"] if epoch is None else epoch
    return stop is not None and done >= stop - 1e-9


def profiling() -> bool:
    return ENV_PROFILE in os.environ


class _Profile:
    def __init__(self) -> None:
        self.marks: list[float] = []  # perf_counter at the end of each iteration
        self.cpu: list[float] = []
        self.data_s: list[float] = []
        self.info: dict[str, Any] = {}
        self.iters_per_epoch = 0
        self.written = False


_profile = _Profile()


def profile_iterations() -> int:
    """Iterations a profile run wants (warm-up plus timed); 0 outside a profile run. A
    program that trains fewer is measured on those it trains."""
    if ENV_PROFILE not in os.environ:
        return 0
    return (max(1, int(os.environ.get(ENV_PROFILE_WARMUP, "1")))
            + max(1, int(os.environ.get(ENV_PROFILE_ITERATIONS, "10"))))


def set_profile_info(**info: Any) -> None:
    """Add fields to the profile result (`eval_s_per_epoch`, `versions`, ...)."""
    _profile.info.update(info)


def iteration(data_s: float = 0.0, iters_per_epoch: int = 1) -> None:
    """Mark the end of one training iteration (`data_s`: seconds of it spent loading
    data). Outside a profile run it only notes the time: the next `report()` says the
    median seconds per iteration since the last one.

    In a profile run the first `$HYPERSACK_PROFILE_WARMUP` iterations (default 1: the
    pipeline set-up) are not timed; the next `$HYPERSACK_PROFILE_ITERATIONS` (default
    10) are. The result holds the median seconds per iteration, the share of them spent
    loading data, the set-up time from process start to the first iteration, the CPU
    cores used and the peak resident memory; then the process ends with exit code 0.
    A program that ends sooner is measured on the iterations it ran (at least one; the
    result says how many): a profile is never longer than the trial itself."""
    path = os.environ.get(ENV_PROFILE)
    if path is None:
        _timing.mark()
        return
    p = _profile
    if not p.marks:
        atexit.register(_write_profile, path, iters_per_epoch)
    p.marks.append(time.perf_counter())
    p.cpu.append(time.process_time())
    p.data_s.append(data_s)
    p.iters_per_epoch = iters_per_epoch
    if len(p.marks) < profile_iterations():
        return
    _write_profile(path, iters_per_epoch)
    sys.exit(0)


def _write_profile(path: str, iters_per_epoch: int) -> None:
    p = _profile
    if p.written or not p.marks:
        return
    p.written = True
    iters_per_epoch = p.iters_per_epoch or iters_per_epoch
    # Warm-up iterations are skipped while at least one timed iteration is left.
    warmup = min(max(1, int(os.environ.get(ENV_PROFILE_WARMUP, "1"))), len(p.marks) - 1)
    if warmup > 0:
        # Iteration k (1-based) ends at marks[k-1]; the timed ones follow the warm-up.
        times = [b - a for a, b in zip(p.marks[warmup - 1:], p.marks[warmup:], strict=False)]
        cpu_s = p.cpu[-1] - p.cpu[warmup - 1]
    else:
        # One iteration in all: timed from the SDK's import, set-up included (an upper
        # bound, which is the safe side for a demand).
        times = [p.marks[0] - _IMPORTED]
        cpu_s = p.cpu[0] - _IMPORTED_CPU
    data = p.data_s[warmup:]
    total = sum(times)
    # The median: one iteration slowed by a neighbour on a shared node (or a garbage
    # collection) would otherwise move a whole trial's inferred run time.
    iter_time = statistics.median(times)
    # Set-up: from process start to the start of the first iteration, taken as the end
    # of the first one less one timed iteration.
    setup = max(0.0, p.marks[0] - iter_time - _process_start_perf()) if warmup else 0.0
    # The timed iterations' span on the wall clock, which the agent shares: it reads the
    # device's use over this window alone, not over the process's start.
    to_wall = time.time() - time.perf_counter()
    began = p.marks[warmup - 1] if warmup else _IMPORTED
    result = {
        "cpu_cores": cpu_s / total if total > 0 else 0.0,
        "peak_rss_mib": _peak_rss_mib(),
        "iter_time_s": iter_time,
        "iter_time_mean_s": total / len(times),
        "data_fraction": min(1.0, sum(data) / total) if total > 0 else 0.0,
        "iters_per_epoch": max(1, int(iters_per_epoch)),
        "iterations": len(times),
        "setup_s": setup,
        "window": [began + to_wall, p.marks[-1] + to_wall],
        **p.info,
    }
    fd = _inherited(ENV_PROFILE_FD)
    if fd is not None:  # the agent's channel: the whole result at its start
        os.ftruncate(fd, 0)
        _write_all(fd, json.dumps(result).encode(), at=0)
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, path)


def _process_start_perf() -> float:
    """This process's start time on the perf_counter clock."""
    try:
        import psutil

        started = psutil.Process().create_time()
    except Exception:
        return _IMPORTED
    return time.perf_counter() - (time.time() - started)


_IMPORTED = time.perf_counter()
_IMPORTED_CPU = time.process_time()


def _after_fork() -> None:
    """A trial forked from a warm process (`hypersack.runner.zygote`) starts afresh: no
    epoch reported, no iteration timed, its set-up timed from now."""
    global _IMPORTED, _IMPORTED_CPU, _profile
    _reported["step"] = 0
    _profile = _Profile()
    _IMPORTED = time.perf_counter()
    _IMPORTED_CPU = time.process_time()


def _peak_rss_mib() -> float:
    try:
        import resource
    except ImportError:  # not on POSIX
        return 0.0
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib / 1024 if sys.platform != "darwin" else kib / 2**20


def out_of_memory(message: str = "out of memory") -> NoReturn:
    print(f"hypersack: {message}", file=sys.stderr)
    sys.exit(OOM_EXIT_CODE)


def finite(value: float) -> float:
    return value if math.isfinite(value) else float("inf")
