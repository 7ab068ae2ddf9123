"""The trial-side SDK: `hypersack.report(step=..., **metrics)` and profiling hooks.

A trial program talks to its agent through files named in its environment, so it
needs no network and nothing is lost if the agent reconnects meanwhile:

- `report()` appends one JSON line to `$HYPERSACK_METRICS_FILE`; the agent forwards
  the values to the server, and the last value of each metric is the trial's result.
- `iteration()` marks one training iteration. In a profile run (the agent sets
  `$HYPERSACK_PROFILE_FILE`), it times the iterations after the warm-up ones and,
  once enough are measured, writes seconds per iteration, the share spent loading
  data and the iterations per epoch to that file and ends the process (exit 0).
- `out_of_memory()` ends the process with the exit code the agent reports as an
  out-of-memory death, so the scheduler retries with a larger memory demand.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from typing import Any, NoReturn

ENV_TRIAL_ID = "HYPERSACK_TRIAL_ID"
ENV_STUDY_ID = "HYPERSACK_STUDY_ID"
ENV_PARAMS = "HYPERSACK_PARAMS"
ENV_EPOCHS = "HYPERSACK_EPOCHS"
ENV_OPTIONS = "HYPERSACK_PROGRAM_OPTIONS"
ENV_METRICS = "HYPERSACK_METRICS_FILE"
ENV_PROFILE = "HYPERSACK_PROFILE_FILE"
ENV_PROFILE_ITERATIONS = "HYPERSACK_PROFILE_ITERATIONS"
ENV_PROFILE_WARMUP = "HYPERSACK_PROFILE_WARMUP"
OOM_EXIT_CODE = 86


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


def report(step: int | None = None, **metrics: float) -> None:
    """Send metrics to the agent. Call it once per epoch (or more often)."""
    path = os.environ.get(ENV_METRICS)
    values = {k: float(v) for k, v in metrics.items()}
    line = json.dumps({"t": time.time(), "step": step, "metrics": values})
    if path is None:
        print(f"hypersack.report: {line}", file=sys.stderr)
        return
    with open(path, "a") as f:
        f.write(line + "\n")


def profiling() -> bool:
    return ENV_PROFILE in os.environ


class _Profile:
    def __init__(self) -> None:
        self.marks: list[float] = [time.perf_counter()]
        self.cpu: list[float] = [time.process_time()]
        self.data_s: list[float] = []


_profile: _Profile | None = None


def iteration(data_s: float = 0.0, iters_per_epoch: int = 1) -> None:
    """Mark the end of one training iteration (`data_s`: seconds of it spent loading
    data). Does nothing outside a profile run."""
    global _profile
    path = os.environ.get(ENV_PROFILE)
    if path is None:
        return
    if _profile is None:
        _profile = _Profile()
    _profile.marks.append(time.perf_counter())
    _profile.cpu.append(time.process_time())
    _profile.data_s.append(data_s)
    warmup = int(os.environ.get(ENV_PROFILE_WARMUP, "1"))
    wanted = int(os.environ.get(ENV_PROFILE_ITERATIONS, "10"))
    if len(_profile.marks) - 1 >= warmup + wanted:
        times = [b - a for a, b in zip(_profile.marks, _profile.marks[1:], strict=False)][warmup:]
        data = _profile.data_s[warmup:]
        total = sum(times)
        cpu_s = _profile.cpu[-1] - _profile.cpu[warmup]
        result = {
            "cpu_cores": cpu_s / total if total > 0 else 0.0,
            "peak_rss_mib": _peak_rss_mib(),
            "iter_time_s": statistics.median(times),
            "data_fraction": min(1.0, sum(data) / total) if total > 0 else 0.0,
            "iters_per_epoch": max(1, int(iters_per_epoch)),
            "iterations": len(times),
        }
        with open(path, "w") as f:
            json.dump(result, f)
        sys.exit(0)


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
