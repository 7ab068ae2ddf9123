"""Events: what happened. The drivers (server, embedded run, simulator) produce them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Union

from hypersack.core.types import NodeSpec, Profile, WorkloadKey
from hypersack.grid.space import SearchSpace


class RunningTrial(NamedTuple):
    """One trial a node lists as running. A named tuple, not a frozen dataclass: a
    thousand nodes' heartbeats a second list tens of thousands, and a frozen
    dataclass's constructor cost three times a tuple's."""

    trial_id: str
    gpu_index: int
    peak_memory_mib: int = 0  # observed by the agent since it started; 0: not measured
    peak_utilization_pct: float = 0.0
    attempt: int = 0  # the launch it runs; 0: not said (the simulator)


@dataclass(frozen=True)
class StudySubmitted:
    space: SearchSpace
    owner: str = ""  # the user who submitted it


@dataclass(frozen=True)
class TrialsAsked:
    """The owner of a study with `search: {type: manual}` gives trials to run: each a
    mapping of hyperparameter to value (checked against the space)."""

    study_id: str
    params: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class StudyExtended:
    """More trials for a study of adaptive or random search, active or ended: its
    sampler goes on where it was (`hypersack extend`)."""

    study_id: str
    trials: int


@dataclass(frozen=True)
class StudyCancelled:
    study_id: str


@dataclass(frozen=True)
class NodeJoined:
    """A node registered (or re-registered after a lost connection), with what it still runs."""

    node: NodeSpec
    running: tuple[RunningTrial, ...] = ()


@dataclass(frozen=True)
class Heartbeat:
    node: str
    running: tuple[RunningTrial, ...] = ()


@dataclass(frozen=True)
class NodeLost:
    node: str
    reason: str = "lost"


@dataclass(frozen=True)
class NodeDrained:
    node: str
    draining: bool = True  # False: undrained, it takes new trials again


@dataclass(frozen=True)
class TrialProgress:
    trial_id: str
    node: str
    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    attempt: int = 0
    nonfinite: tuple[str, ...] = ()  # metrics it reported as NaN or infinite
    # Each step reported since the last progress event, with that step's own metrics
    # (its learning curve; `metrics` is the latest value of each).
    steps: tuple[tuple[int, dict[str, float]], ...] = ()
    # Seconds per iteration the trial saw over the last `iter_window_s` seconds (0: not
    # measured): the learned sharing level's sample (orchestrator/learned.py).
    iter_time_s: float = 0.0
    iter_window_s: float = 0.0


@dataclass(frozen=True)
class TrialFinished:
    trial_id: str
    node: str
    metrics: dict[str, float] = field(default_factory=dict)
    objective: float | None = None  # None: the study's objective metric, if reported
    log_tail: str = ""
    attempt: int = 0
    nonfinite: tuple[str, ...] = ()  # metrics it reported as NaN or infinite


@dataclass(frozen=True)
class TrialFailed:
    trial_id: str
    node: str
    exit_code: int
    log_tail: str = ""
    attempt: int = 0
    # Stopped by its node's fence (its agent lost the server): not the trial's failure.
    fenced: bool = False


@dataclass(frozen=True)
class TrialLogged:
    """The log tail of an attempt the server stopped (pruned, cancelled, preempted):
    kept with the trial, so that its log can be read."""

    trial_id: str
    node: str
    attempt: int
    log_tail: str


@dataclass(frozen=True)
class TrialOutOfMemory:
    trial_id: str
    node: str
    observed_memory_mib: int = 0
    attempt: int = 0


@dataclass(frozen=True)
class ProfileMeasured:
    profile: Profile
    node: str = ""
    # The trial whose parameters the job ran, as the job named it ("": not said, as
    # agents before it): a copy of an earlier job's result is told from the current's.
    sample: str = ""


@dataclass(frozen=True)
class ProfileFailed:
    key: WorkloadKey
    arch: str
    node: str
    reason: str
    sample: str = ""  # as ProfileMeasured's


@dataclass(frozen=True)
class ProfilesForgotten:
    """The history forgets a workload's profiles and failures (on one architecture, or
    all): its next study profiles it again."""

    model: str
    arch: str = ""


@dataclass(frozen=True)
class ProfilesImported:
    """Profiles from a file or another cluster's history; `replace`: over what is known."""

    profiles: tuple[Profile, ...]
    replace: bool = False


@dataclass(frozen=True)
class Tick:
    pass


@dataclass(frozen=True)
class Wake:
    """Time-driven work only (held promotions whose window passed), without the tick's
    heartbeat check: a driver with no heartbeats (the simulator) sends it at `wake_at()`."""


Event = Union[
    StudySubmitted, StudyCancelled, StudyExtended, TrialsAsked, NodeJoined, Heartbeat,
    NodeLost, NodeDrained,
    TrialProgress, TrialFinished, TrialFailed, TrialOutOfMemory, TrialLogged,
    ProfileMeasured, ProfileFailed, ProfilesImported, ProfilesForgotten, Tick, Wake,
]


