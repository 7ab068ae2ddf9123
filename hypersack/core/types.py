"""Domain types. Frozen pydantic models: values, never shared mutable state."""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hypersack.core.bounds import (
    INT32_MAX,
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    MAX_FUSION_WIDTH,
    MAX_GPUS_PER_NODE,
    MAX_MEMORY_MIB,
    MAX_NODES,
    MAX_PRIORITY,
    MAX_WEIGHT,
    ComputePct,
    Cores,
    Count,
    Epochs,
    Fraction,
    MemoryMiB,
    Name,
    Seconds,
    Text,
    Timestamp,
)
from hypersack.core.catalog import MODELS

MAX_KEY_PARAMS = 16
MAX_RUNG_VALUES = 4096  # objective values kept per trial for its pruner
# A trial's learning curve in the store: at most this many steps (past it, every other
# step is dropped, the first and the last kept), each with at most this many metrics
# (the objective first).
MAX_HISTORY_STEPS = 1000
MAX_HISTORY_METRICS = 16
_KEY_PARAM_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# The demand key that makes a stated demand its study's own (see grid.expand.workload_key).
STATED_KEY = "stated_by"
KEY_VALUE_CHARS = "A-Za-z0-9_.:@+-"  # what a demand key's value in a workload key may hold
_KEY_PARAM_VALUE = re.compile(f"[{KEY_VALUE_CHARS}]{{1,64}}")


class Frozen(BaseModel):
    # No float field of a domain type is ever NaN or infinite.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class WorkloadKey(Frozen):
    """What decides a trial's demand on a GPU: trials with equal keys share one profile."""

    model: Name  # the workload: a zoo model, or a user's program (its name or hash)
    batch_size: int = Field(ge=0, le=MAX_BATCH_SIZE)  # 0: the program has none
    optimizer: Name = "sgd"
    precision: Name = "fp32"
    fusion_width: int = Field(default=1, gt=0, le=MAX_FUSION_WIDTH)
    # The values of the program's other demand keys (settings.demand_keys), sorted.
    params: tuple[tuple[str, str], ...] = Field(default=(), max_length=MAX_KEY_PARAMS)

    @field_validator("params")
    @classmethod
    def _params(cls, params: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        for name, value in params:
            if not _KEY_PARAM_NAME.fullmatch(name) or not _KEY_PARAM_VALUE.fullmatch(value):
                raise ValueError(f"demand key {name[:64]!r}={value[:64]!r}: names are "
                                 "identifiers, values up to 64 of A-Za-z0-9_.:@+-")
        if list(params) != sorted(set(params)) or len({n for n, _ in params}) != len(params):
            raise ValueError("demand keys must be sorted and unique")
        return params

    def label(self) -> str:
        """`resnet18/b64/sgd/fp32/k1` for a zoo model; a user's program shows only what
        it has besides its name (`alice:mlp/width=64`): the fields it keeps at their
        defaults (no batch size, sgd, fp32, alone) are left out."""
        extra = "".join(f"/{n}={v}" for n, v in self.params)
        if self.model in MODELS:
            return (f"{self.model}/b{self.batch_size}/{self.optimizer}/{self.precision}"
                    f"/k{self.fusion_width}{extra}")
        parts = [f"b{self.batch_size}" if self.batch_size else "",
                 self.optimizer if self.optimizer != "sgd" else "",
                 self.precision if self.precision != "fp32" else "",
                 f"k{self.fusion_width}" if self.fusion_width != 1 else ""]
        return self.model + "".join(f"/{p}" for p in parts if p) + extra

    def params_text(self) -> str:
        """The demand keys as a profile file writes them: `width=512,depth=4`."""
        return ",".join(f"{n}={v}" for n, v in self.params)


def parse_key_params(text: str) -> tuple[tuple[str, str], ...]:
    """`width=512,depth=4` (a profile file's `params` column) -> sorted pairs."""
    pairs = []
    for item in (text or "").split(","):
        if item.strip():
            name, sep, value = item.strip().partition("=")
            if not sep:
                raise ValueError(f"params {item[:64]!r}: expected NAME=VALUE")
            pairs.append((name.strip(), value.strip()))
    return tuple(sorted(pairs))


class Demand(Frozen):
    """What one trial needs from one GPU (compute, memory) and its node (cores)."""

    compute_pct: ComputePct
    memory_mib: MemoryMiB
    cores: Cores


class Profile(Frozen):
    """A workload measured (or estimated) on one GPU architecture."""

    key: WorkloadKey
    arch: Name
    demand: Demand
    iter_time_s: Seconds = Field(gt=0)
    iters_per_epoch: int = Field(gt=0, le=INT32_MAX)
    data_fraction: Fraction = 0.0
    source: Text = "measured"
    setup_s: Seconds = 0.0  # process start to the first iteration
    eval_s_per_epoch: Seconds = 0.0  # validation after each epoch
    versions: Text = ""  # driver and library versions it was measured with
    measured_at: Timestamp = 0.0  # seconds since the epoch; 0: estimated
    # Feedback from trials that ran with this profile: the largest peak memory and
    # utilization a single trial showed, and how many trials reported.
    observed_memory_mib: MemoryMiB = 0
    observed_compute_pct: ComputePct = 0.0
    observed_trials: Count = 0
    corrected: Text = ""  # why the demand was raised after it was measured

    def epoch_time_s(self) -> float:
        return self.iter_time_s * self.iters_per_epoch + self.eval_s_per_epoch

    def run_time_s(self, epochs: float) -> float:
        """Expected run time of a whole trial, inferred from the time per iteration."""
        return self.setup_s + self.epoch_time_s() * epochs


class GpuSpec(Frozen):
    index: int = Field(ge=0, lt=MAX_GPUS_PER_NODE * 4)
    arch: Name
    memory_mib: int = Field(gt=0, le=MAX_MEMORY_MIB)
    uuid: str = Field(default="", max_length=128, pattern=r"^[A-Za-z0-9_.:/-]*$")


class NodeSpec(Frozen):
    name: Name
    cores: Cores = Field(gt=0)
    gpus: tuple[GpuSpec, ...] = Field(max_length=MAX_GPUS_PER_NODE)
    # The one study owner whose trials the node runs ("": anyone's). A node whose agent
    # is not root runs every trial as its own Unix user, so it runs one owner's only.
    owner: str = Field(default="", max_length=128,
                       pattern=r"^([A-Za-z0-9_][A-Za-z0-9_.:@+=-]*)?$")

    def takes(self, owner: str) -> bool:
        """Whether this node runs trials of studies of this owner."""
        return not self.owner or self.owner == owner


class ClusterSpec(Frozen):
    nodes: tuple[NodeSpec, ...] = Field(max_length=MAX_NODES)

    def gpu_count(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    def archs(self) -> set[str]:
        return {g.arch for n in self.nodes for g in n.gpus}


class TrialState(str, Enum):
    PENDING = "PENDING"
    PROFILING = "PROFILING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    DIVERGED = "DIVERGED"  # stopped early: a non-finite objective, or past a stop_if bound
    CANCELLED = "CANCELLED"
    PRUNED = "PRUNED"  # stopped early by the study's pruner (it ranked too low at a rung)
    # Stopped at a rung with its checkpoint, holding no GPU: the pruner promotes it (it
    # resumes, PENDING again) or prunes it.
    PAUSED = "PAUSED"

    @property
    def terminal(self) -> bool:
        return self in (TrialState.COMPLETED, TrialState.FAILED, TrialState.DIVERGED,
                        TrialState.CANCELLED, TrialState.PRUNED)


class StudyState(str, Enum):
    ACTIVE = "ACTIVE"
    COMPLETED = "COMPLETED"  # every trial ended, at least one of them COMPLETED
    FAILED = "FAILED"  # every trial ended, none COMPLETED (failed or diverged)
    CANCELLED = "CANCELLED"


class TrialRecord(Frozen):
    """A trial as the Store keeps it. Changes make a new record (`model_copy(update=...)`)."""

    id: str
    study_id: str
    coords: tuple[int, ...]
    params: dict[str, Any]
    key: WorkloadKey
    epochs: Epochs
    state: TrialState = TrialState.PENDING
    failures: int = 0
    launches: int = 0
    memory_override_mib: int | None = None
    # The fused group its latest attempt runs in ("" alone), and that group's width.
    group: str = Field(default="", max_length=256)
    group_width: int = Field(default=0, ge=0, le=MAX_FUSION_WIDTH)
    node: str | None = None
    gpu_index: int | None = None
    launched_on: str | None = None  # the node of the latest attempt, kept when it is lost
    # The latest attempt whose exit was handled: agents send an exit again until the
    # server acknowledges it, and a repeat of one already handled changes nothing.
    exited: int = Field(default=0, ge=0)
    demand: Demand | None = None
    started_at: float | None = None
    finished_at: float | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    objective: float | None = None
    reason: str = ""
    log_tail: str = ""
    # Early stopping (a study with a pruner): the objective at each rung it reached (the
    # median pruner: at each epoch from its first), the epochs its checkpoint holds, and
    # the epoch its current attempt stops at to be ranked (None: its last).
    rungs: dict[int, float] = Field(default_factory=dict, max_length=MAX_RUNG_VALUES)
    done_epochs: float = Field(default=0.0, ge=0, le=MAX_EPOCHS)
    stop_at: float | None = Field(default=None, ge=0, le=MAX_EPOCHS)


class StudyRecord(Frozen):
    id: str
    name: str
    space: dict[str, Any]
    state: StudyState = StudyState.ACTIVE
    submitted_at: float = 0.0
    seq: int = 0
    owner: str = ""  # the user who submitted it; "" before authentication existed
    warnings: tuple[str, ...] = ()  # said once each, for people (a missing objective, ...)


class Role(str, Enum):
    ADMIN = "admin"  # nodes, drain, profile import, users, any study
    USER = "user"  # submits studies; reads, cancels and sees logs of their own


class UserRecord(Frozen):
    name: Name
    role: Role
    created_at: float = 0.0


class TokenRecord(Frozen):
    """A bearer token: only its SHA-256 is kept; the token itself is shown once."""

    id: str
    user: str
    sha256: str
    created_at: float = 0.0
    revoked_at: float = 0.0  # 0: valid
    label: str = ""
    expires_at: float = 0.0  # 0: never


class UserShare(Frozen):
    """How one user shares the cluster with others (the server's `shares` setting, by user
    name; `*` for everyone not named). See `orchestrator.shares` for the rule."""

    weight: float = Field(default=1.0, gt=0, le=MAX_WEIGHT)
    max_gpus: int | None = Field(default=None, ge=0, le=1 << 24)  # distinct GPUs at once
    max_compute: float | None = Field(default=None, ge=0, le=1.0e7)  # GPU-equivalents
    max_priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)


class NodeRecord(Frozen):
    spec: NodeSpec
    draining: bool = False


def ceil_units(value: float, scale: int) -> int:
    """A demand in integer units, rounded up (never under-reserve)."""
    return math.ceil(round(value * scale, 6))


def floor_units(value: float, scale: int) -> int:
    """A capacity in integer units, rounded down (never over-promise)."""
    return math.floor(round(value * scale, 6))


class HistoryStep(NamedTuple):
    """One step (epoch) of a trial's learning curve, as the server received it."""

    trial_id: str
    step: int
    at: float  # seconds since the epoch
    metrics: dict[str, float]


class Span(NamedTuple):
    """One attempt of a trial on a GPU, from its launch to its end: the real Gantt."""

    trial_id: str
    attempt: int
    node: str
    gpu_index: int
    start: float
    end: float
    group: str = ""  # its fused group ("": alone)


def thinned(steps: list[int], limit: int = MAX_HISTORY_STEPS) -> list[int]:
    """The steps a curve drops to stay within `limit`: every other one, the first and
    the last kept (the curve keeps its shape at half the resolution)."""
    if len(steps) <= limit:
        return []
    ordered = sorted(steps)
    return ordered[1:-1:2]
