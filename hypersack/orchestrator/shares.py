"""How active studies share the cluster: the rule docs/sharing.md states.

1. **Priority first.** Studies decide in order of `priority`, highest first; a study of a
   higher priority may take all it can use before a lower one places anything.
2. **Weighted fair share within a priority**, of *scaled compute* measured in
   GPU-equivalents (a trial holding 80 % on an A100 of ratio 3 holds 0.8 / 3 = 0.267 of
   a GPU; a trial asking no compute still counts 1 %). The capacity the level has is
   split between its users by their weights and each user's part between their studies
   by the studies' weights, max-min: a claimant with nothing pending cannot grow, so what
   it does not hold goes to the others. A decision first lets each study place up to its
   share, the most under-served (held / share) first, then hands out what is left in the
   same order: no GPU idles while any study could use it (work-conserving). One
   exception keeps large trials from starving behind small ones: when a study below its
   share (or of a higher priority) has a waiting trial that fits an empty GPU but found
   no room, the GPU closest to fitting it is reserved for it, up to its share: others
   place nothing new there, and it drains until the trial fits. So shares converge to
   the weights as trials end, without stopping anything.
3. **Quotas per user**: at most `max_gpus` distinct GPUs holding their trials and at most
   `max_compute` GPU-equivalents of scaled compute; a placement past either waits.
4. **Preemption**: a study with `preempt: true` whose pending trials still do not fit has
   trials of studies of *lower* priority stopped and requeued (no failure counted, the
   trial runs again from its start or its own checkpoint) where that makes room.

Everything here is arithmetic over plain values; the orchestrator gathers the claims
from its state and carries the decisions out.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hypersack.core.types import UserShare
from hypersack.policies.base import Item

EPS = 1e-9
MIN_COMPUTE_UNITS = 100  # 1 %: the least a trial counts for in a share (Need units)


@dataclass
class Claim:
    """One active study's standing in a decision."""

    study_id: str
    user: str
    priority: int
    weight: float
    seq: int
    used: float = 0.0  # GPU-equivalents of scaled compute its running trials hold
    pending: bool = False  # it has trials waiting to be placed
    # Of its waiting trials, those that fit an empty GPU but found no room: GPUs are
    # reserved for them (see the module's rule 2).
    unfit: list[Item] = field(default_factory=list)


def share_of(compute_units: int, gpu_capacity_units: int) -> float:
    """A trial's hold on one GPU in GPU-equivalents of scaled compute."""
    if gpu_capacity_units <= 0:
        return 0.0
    return max(compute_units, MIN_COMPUTE_UNITS) / gpu_capacity_units


def water_fill(capacity: float, claimants: Sequence[tuple[float, float]]) -> list[float]:
    """Max-min fair split of `capacity` between (weight, demand) claimants: each gets
    capacity in proportion to its weight, none more than its demand (math.inf: no bound),
    and what one cannot use is split again between the rest."""
    alloc = [0.0] * len(claimants)
    active = [i for i, (w, d) in enumerate(claimants) if w > 0 and d > 0]
    left = max(0.0, capacity)
    while active and left > EPS:
        total = sum(claimants[i][0] for i in active)
        capped = [i for i in active
                  if claimants[i][1] - alloc[i] <= left * claimants[i][0] / total + EPS]
        if not capped:
            for i in active:
                alloc[i] += left * claimants[i][0] / total
            break
        for i in capped:
            left -= claimants[i][1] - alloc[i]
            alloc[i] = claimants[i][1]
        active = [i for i in active if i not in capped]
    return alloc


def targets(claims: Sequence[Claim], capacity: float,
            user_weight: Callable[[str], float]) -> dict[str, float]:
    """Each claim's fair share of `capacity` (GPU-equivalents): split between users by
    weight, then within a user between studies by weight, max-min. A study with nothing
    pending demands only what it holds."""
    by_user: dict[str, list[Claim]] = {}
    for c in claims:
        by_user.setdefault(c.user, []).append(c)
    users = sorted(by_user)

    def demand(c: Claim) -> float:
        return math.inf if c.pending else c.used

    user_alloc = water_fill(capacity, [
        (user_weight(u), sum(demand(c) for c in by_user[u])) for u in users])
    out: dict[str, float] = {}
    for u, part in zip(users, user_alloc, strict=True):
        studies = by_user[u]
        for c, a in zip(studies, water_fill(part, [(c.weight, demand(c)) for c in studies]),
                        strict=True):
            out[c.study_id] = a
    return out


def deficit_order(claims: Sequence[Claim], shares: Mapping[str, float]) -> list[Claim]:
    """The most under-served first: held / share, then submission order."""
    def key(c: Claim) -> tuple[float, int]:
        share = shares.get(c.study_id, 0.0)
        return (c.used / share if share > EPS else math.inf, c.seq)
    return sorted(claims, key=key)


def levels(claims: Sequence[Claim]) -> list[list[Claim]]:
    """Claims grouped by priority, highest first."""
    by: dict[int, list[Claim]] = {}
    for c in claims:
        by.setdefault(c.priority, []).append(c)
    return [by[p] for p in sorted(by, reverse=True)]


@dataclass
class Quota:
    """What a user may still take in this decision: `compute`, GPU-equivalents of scaled
    compute; `gpus`, how many more distinct GPUs they may occupy besides those in `held`.
    None: no limit. One object serves all of a user's studies."""

    compute: float | None = None
    gpus: int | None = None
    held: set[tuple[str, int]] = field(default_factory=set)

    def copy(self) -> Quota:
        return Quota(self.compute, self.gpus, set(self.held))

    def allows(self, gpu: tuple[str, int], cost: float) -> bool:
        if self.compute is not None and cost > self.compute + EPS:
            return False
        return self.gpus is None or gpu in self.held or self.gpus > 0

    def take(self, gpu: tuple[str, int], cost: float) -> None:
        if self.compute is not None:
            self.compute -= cost
        if gpu not in self.held:
            self.held.add(gpu)
            if self.gpus is not None:
                self.gpus -= 1


def quota_left(rule: UserShare, used: float, held: set[tuple[str, int]]) -> Quota:
    """A user's quota left, given what their trials hold now."""
    return Quota(
        compute=None if rule.max_compute is None else max(0.0, rule.max_compute - used),
        gpus=None if rule.max_gpus is None else max(0, rule.max_gpus - len(held)),
        held=set(held))
