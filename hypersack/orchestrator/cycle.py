"""One decision cycle's scratch state: each active study's claim, each user's quota left
and the GPUs reserved so far. A study's decision (or preemption) works on copies of its
claim and its user's quota, which replace the originals only when it succeeds: one that
raises, and is undone, leaves no trace in the cycle (as the Kubernetes scheduler copies its
CycleState for each attempt)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from hypersack.orchestrator.shares import Claim, Quota


@dataclass
class CycleState:
    claims: list[Claim]
    quotas: dict[str, Quota]
    reserved: dict[tuple[str, int], str] = field(default_factory=dict)  # GPU -> study

    @contextmanager
    def attempt(self, claim: Claim) -> Iterator[tuple[Claim, Quota]]:
        """Copies of the claim and its user's quota to change; kept if the block returns."""
        mine = replace(claim, unfit=list(claim.unfit))
        quota = self.quotas[claim.user].copy()
        yield mine, quota
        vars(claim).update(vars(mine))
        self.quotas[claim.user] = quota

    def closed_to(self, study_id: str) -> set[tuple[str, int]]:
        """GPUs reserved for other studies: this one places nothing there."""
        return {g for g, sid in self.reserved.items() if sid != study_id}
