"""Shared by the benchmarks: a real first decision's input, built by the orchestrator."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.grid.space import load_space, parse_space
from hypersack.orchestrator import NodeJoined, Orchestrator, StudySubmitted
from hypersack.policies.base import ClusterView, Item
from hypersack.sampler.profiles import load_profiles
from hypersack.store import MemoryStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def first_decision(space_data: object, cluster: str, ratio: float | None = None
                   ) -> tuple[list[Item], ClusterView]:
    """The pending trials and the empty cluster of a study's first decision."""
    space = (load_space(space_data) if isinstance(space_data, (str, Path))
             else parse_space(space_data))
    if ratio is not None:
        space = space.model_copy(update={"settings": space.settings.model_copy(
            update={"oversubscription": {"A100": ratio, "H100": ratio}})})
    store = MemoryStore()
    for p in load_profiles(EXAMPLES / "profiles-estimates.yaml"):
        store.put_profile(p)
    orch = Orchestrator(store, ManualClock(0.0))
    for node in parse_shorthand(cluster).nodes:
        orch.handle(NodeJoined(node))
    orch.handle(StudySubmitted(space))
    decision = orch.decisions[-1]
    return list(decision.batch), decision.view
