"""What a simulation gives back: each trial's runs on the GPUs (`Segment`), the makespan,
occupancy and the other totals (`SimResult`), and the time-mean of its step functions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Segment:
    """One trial's run on one GPU, for timelines and Gantt charts."""

    trial_id: str
    model: str
    node: str
    gpu_index: int
    start_s: float
    end_s: float
    outcome: str  # COMPLETED, KILLED, LOST, PROFILE
    members: int = 1  # a fused group's trials (its trial_id is the group's)


@dataclass
class SimResult:
    makespan_s: float
    completed: int
    failed: int
    trials: int
    launches: int
    mean_occupancy: float  # time-mean share of scaled compute in use, over GPUs
    mean_busy: float  # time-mean share of GPUs running at least one trial
    decisions: int
    decision_time_s: float
    profile_jobs: int
    gpus: list[tuple[str, int, str]]
    timeline: list[Segment] = field(default_factory=list)
    stuck: bool = False
    # Occupancy over time, a step function: (from time s, mean share over live GPUs).
    occupancy: list[tuple[float, float]] = field(default_factory=list)
    # Several studies: each one's share of the live GPUs' scaled compute over time (a
    # step function, as occupancy), when it was submitted, when its first and last
    # trials launched, and when it ended.
    shares: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    submitted_s: dict[str, float] = field(default_factory=dict)
    first_launch_s: dict[str, float] = field(default_factory=dict)
    last_launch_s: dict[str, float] = field(default_factory=dict)  # its last trial out
    ended_s: dict[str, float] = field(default_factory=dict)
    # Work conservation: GPU-seconds during which a GPU held nothing while a waiting
    # trial fit it (Orchestrator.idle_fits, read after every event), and how many events
    # left such a GPU behind them.
    idle_fit_s: float = 0.0
    idle_fit_events: int = 0
    # Each study's rule under the default policy `predict`, and why (orchestrator/
    # foresight.py); absent for a study under a named policy.
    rules: dict[str, str] = field(default_factory=dict)

    def summary(self) -> dict[str, float | int | bool]:
        return {
            "makespan_s": round(self.makespan_s, 3), "completed": self.completed,
            "failed": self.failed, "trials": self.trials, "launches": self.launches,
            "mean_occupancy": round(self.mean_occupancy, 4),
            "mean_busy": round(self.mean_busy, 4), "decisions": self.decisions,
            "decision_time_ms": round(self.decision_time_s * 1000, 3),
            "profile_jobs": self.profile_jobs, "stuck": self.stuck,
            "idle_fit_s": round(self.idle_fit_s, 3), "idle_fit_events": self.idle_fit_events,
        }


def time_mean(series: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """The time-mean of a step function [(from time, value), ...] over [start, end]."""
    area = 0.0
    for i, (at, value) in enumerate(series):
        nxt = series[i + 1][0] if i + 1 < len(series) else end
        area += value * max(0.0, min(nxt, end) - max(at, start))
    return area / (end - start) if end > start else 0.0
