"""Fused groups: which pending trials may train together in one process, which fused
widths to profile, which measured widths are worth using, and a group's demand split
among its members. Pure functions; the orchestrator applies them.

Trials fuse when they share the workload key (model, batch size, optimizer, precision),
the epochs and every hyperparameter that is not fusable; fusable are those the fused
trainer keeps per member: learning rate, weight decay, momentum, Adam's betas and
epsilon, and the initialization seed. Only the built-in trainer fuses
(`hypersack.runner.fused_train`), with SGD, Adam or AdamW in fp32, bf16 or fp16 (a loss
scale per member: runner/amp.py). The precision is part of the workload key, so each
precision is profiled, and fused, apart.

A width K is measured as its own workload key (`fusion_width` K) on each architecture:
one placement item with the group's demand, never K times a trial's. It is used only
where it is cheaper per trial than a trial alone: iteration time times the dominant
share of the GPU (compute of the scaled capacity, or memory), per member.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from hypersack.core.catalog import MODELS
from hypersack.core.train_options import PRECISIONS
from hypersack.core.types import Demand, Profile, TrialRecord, WorkloadKey
from hypersack.grid.space import SearchSpace

FUSABLE = frozenset({"lr", "weight_decay", "momentum", "beta1", "beta2", "eps", "seed"})
FUSED_OPTIMIZERS = ("sgd", "adam", "adamw")  # the fused trainer's optimizers
FUSED_PRECISIONS = PRECISIONS  # autocast; fp16 with a scale per member

FusionClass = tuple[WorkloadKey, float, tuple[tuple[str, str], ...]]


def enabled(space: SearchSpace) -> bool:
    """The study lets its trials fuse: the built-in trainer, and fusion `on`, or `auto`
    in a study without a pruner (with one, fused members reach each rung later: see
    `Settings.fusion`)."""
    wanted = space.settings.fusion == "on" or (
        space.settings.fusion == "auto" and space.pruner is None)
    return (space.program.builtin == "train" and wanted
            and space.settings.max_fusion_width >= 2)


def class_of(t: TrialRecord) -> FusionClass | None:
    """What a trial must share with the others of its group; None: it never fuses (a
    model the fused trainer cannot train, an optimizer or precision it does not fuse,
    or a trial that asks for more memory after running out of it)."""
    key = t.key
    # The trial's own optimizer and precision, also where they are not demand keys.
    if (not fusable_model(key.model) or key.fusion_width != 1
            or str(t.params.get("optimizer", key.optimizer)) not in FUSED_OPTIMIZERS
            or str(t.params.get("precision", key.precision)) not in FUSED_PRECISIONS
            or t.memory_override_mib is not None):
        return None
    rest = tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in t.params.items()
                        if k not in FUSABLE))
    return key, float(t.epochs), rest


def fusable_model(model: str) -> bool:
    """A model the fused trainer trains: one of the zoo's PyTorch models."""
    info = MODELS.get(model)
    return info is not None and info.needs_torch


def fused_key(key: WorkloadKey, width: int) -> WorkloadKey:
    """The workload key of that width (1: the workload alone)."""
    return key.model_copy(update={"fusion_width": width})


def candidate_widths(max_width: int, trials: int) -> list[int]:
    """The widths worth measuring: powers of two from 2 up to the study's limit and the
    class's size."""
    out, w = [], 2
    while w <= min(max_width, trials):
        out.append(w)
        w *= 2
    return out


def fit_memory(points: Iterable[tuple[int, int]]) -> tuple[float, float] | None:
    """Fused memory as a + b*K by least squares over measured (K, MiB); None with fewer
    than two widths."""
    pts = sorted(set(points))
    if len({k for k, _ in pts}) < 2:
        return None
    n = len(pts)
    mk = sum(k for k, _ in pts) / n
    mm = sum(m for _, m in pts) / n
    var = sum((k - mk) ** 2 for k, _ in pts)
    b = sum((k - mk) * (m - mm) for k, m in pts) / var
    return mm - b * mk, b


def predicted_memory_mib(profiles: Mapping[tuple[WorkloadKey, str], Profile],
                         key: WorkloadKey, arch: str, width: int) -> int | None:
    """What width K should need, from the widths measured so far (a + b*K)."""
    points = [(p.key.fusion_width, p.demand.memory_mib) for (k, a), p in profiles.items()
              if a == arch and fused_key(k, 1) == key]
    fit = fit_memory(points)
    if fit is None:
        return None
    a, b = fit
    return math.ceil(a + b * width)


def cost(p: Profile, capacity_pct: float, memory_mib: int) -> float:
    """GPU share-seconds per iteration: iteration time times the dominant share."""
    share = max(p.demand.compute_pct / capacity_pct if capacity_pct > 0 else 0.0,
                p.demand.memory_mib / memory_mib if memory_mib > 0 else 0.0)
    return p.iter_time_s * max(share, 1e-9)


def useful(single: Profile, fused: Profile, capacity_pct: float, memory_mib: int) -> bool:
    """A fused width is worth it where each member costs less than a trial alone."""
    width = fused.key.fusion_width
    return cost(fused, capacity_pct, memory_mib) / width < cost(single, capacity_pct, memory_mib)


def chunks(members: Sequence[Any], widths: Sequence[int]) -> list[list[Any]]:
    """Members cut greedily into groups of the largest usable width that is left (a
    width 1 chunk is a trial alone)."""
    usable = sorted({w for w in widths if w >= 1} | {1}, reverse=True)
    out: list[list[Any]] = []
    pos = 0
    while pos < len(members):
        w = next(w for w in usable if w <= len(members) - pos)
        out.append(list(members[pos:pos + w]))
        pos += w
    return out


def member_share(demand: Demand, width: int) -> Demand:
    """One member's part of its group's demand (memory rounded up: the parts never sum
    to less than the group)."""
    return Demand(compute_pct=demand.compute_pct / width,
                  memory_mib=math.ceil(demand.memory_mib / width),
                  cores=demand.cores / width)
