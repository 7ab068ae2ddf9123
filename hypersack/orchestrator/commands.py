"""Commands: what the orchestrator wants done. Drivers carry them to agents."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Union

from hypersack.core.types import Demand, WorkloadKey
from hypersack.grid.space import Program


@dataclass(frozen=True)
class LaunchTrial:
    trial_id: str
    study_id: str
    node: str
    gpu_index: int
    params: dict[str, Any]
    key: WorkloadKey
    demand: Demand
    epochs: float
    attempt: int = 1  # 1 for the first launch; events of older attempts are stale
    # Early stopping: the epoch this attempt stops at to be ranked (0: its last), and
    # the epochs its checkpoint holds (it resumes from them).
    stop_at: float = 0.0
    done_epochs: float = 0.0
    # What the drivers need, carried so that they never look back into the core: the
    # study's program and its owner (an agent may run the trial as that user).
    program: Program | None = None
    owner: str = ""


@dataclass(frozen=True)
class LaunchGroup:
    """A fused group: its members train in one process on one GPU, each reported as its
    own trial. `key` is the fused workload key (its width), `demand` the group's."""

    group_id: str
    node: str
    gpu_index: int
    key: WorkloadKey
    demand: Demand
    members: tuple[LaunchTrial, ...]


@dataclass(frozen=True)
class KillTrial:
    trial_id: str
    node: str
    reason: str
    attempt: int = 0  # the attempt to kill; 0: whichever runs


@dataclass(frozen=True)
class ProfileWorkload:
    key: WorkloadKey
    arch: str
    node: str
    gpu_index: int
    iterations: int
    warmup: int
    # The trial it profiles with (its parameters, epochs, program and owner): a pending
    # one of that workload; a fused width runs the workload alone K times.
    params: dict[str, Any] = field(default_factory=dict)
    epochs: float = 0.0
    program: Program | None = None
    owner: str = ""
    sample: str = ""  # that trial's id, which the agent's result names again


@dataclass(frozen=True)
class DropCheckpoint:
    """A pruned trial never runs again: the node that holds its checkpoint frees the disk
    (once no attempt of it runs there)."""

    trial_id: str
    study_id: str
    node: str


Command = Union[LaunchTrial, LaunchGroup, KillTrial, ProfileWorkload, DropCheckpoint]


def launched(commands: list[Command]) -> list[LaunchTrial]:
    """Every trial these commands launch, alone or as a member of a fused group."""
    out: list[LaunchTrial] = []
    for c in commands:
        if isinstance(c, LaunchTrial):
            out.append(c)
        elif isinstance(c, LaunchGroup):
            out.extend(c.members)
    return out
