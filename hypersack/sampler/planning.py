"""Profile planning: which (workload, architecture) pairs the history lacks, and on which
GPU each is measured. Pure functions of what the orchestrator tells them."""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from hypersack.core.types import WorkloadKey

Slot = tuple[WorkloadKey, str]  # a workload key on a GPU architecture


@dataclass(frozen=True)
class GpuSlot:
    """One GPU as profile planning sees it."""

    node: str
    index: int
    arch: str
    trials: int  # trials running on it
    profiling: Slot | None = None
    reserved_for: Slot | None = None

    @property
    def free(self) -> bool:
        return self.profiling is None and self.reserved_for is None


@dataclass(frozen=True)
class ProfilePlan:
    start: tuple[tuple[Slot, GpuSlot], ...]  # profile jobs to start now
    reserve: tuple[tuple[Slot, GpuSlot], ...]  # busy GPUs that drain for a profile


def status(key: WorkloadKey, archs: Iterable[str], profiles: Container[Slot],
           failed: Container[Slot]) -> Literal["known", "failed", "waiting"]:
    """A trial's workload is known on some architecture, failed to profile on every one,
    or waits for a profile."""
    archs = list(archs)
    if any((key, a) in profiles for a in archs):
        return "known"
    if archs and all((key, a) in failed for a in archs):
        return "failed"
    return "waiting"


def missing(key: WorkloadKey, archs: Iterable[str], profiles: Container[Slot],
            failed: Container[Slot]) -> list[Slot]:
    """The architectures this workload still needs a profile on (a failed one is not
    tried again until the history changes)."""
    return [(key, a) for a in sorted(archs)
            if (key, a) not in profiles and (key, a) not in failed]


def plan_profiles(wanted: Sequence[Slot], gpus: Sequence[GpuSlot],
                  allowed: Callable[[Slot, GpuSlot], bool] | None = None) -> ProfilePlan:
    """Each wanted profile goes to the first idle free GPU of its architecture; with none
    idle, the least busy free one is reserved, so that the profile does not starve while
    trials keep it busy. A reserved GPU that has drained starts its profile."""
    taken: set[tuple[str, int]] = set()
    start: list[tuple[Slot, GpuSlot]] = []
    reserve: list[tuple[Slot, GpuSlot]] = []
    for slot in wanted:
        free = [g for g in gpus
                if g.arch == slot[1] and g.free and (g.node, g.index) not in taken
                and (allowed is None or allowed(slot, g))]
        if not free:
            continue
        idle = [g for g in free if g.trials == 0]
        gpu = idle[0] if idle else min(free, key=lambda g: g.trials)
        taken.add((gpu.node, gpu.index))
        (start if idle else reserve).append((slot, gpu))
    for g in gpus:
        if (g.reserved_for is not None and g.profiling is None and g.trials == 0
                and (g.node, g.index) not in taken):
            start.append((g.reserved_for, g))
    return ProfilePlan(start=tuple(start), reserve=tuple(reserve))
