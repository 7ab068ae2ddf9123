"""Placement instances for benchmarks and tests: a study's first decision as the
orchestrator builds it, and heterogeneous instances (A100-40GB with H100-80GB, workload
mixes that bind compute, memory or the nodes' cores)."""

from __future__ import annotations

import random
from pathlib import Path

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import Profile
from hypersack.grid.space import load_space, parse_space
from hypersack.orchestrator import NodeJoined, Orchestrator, StudySubmitted
from hypersack.policies.base import (
    ClusterView,
    GpuBin,
    Item,
    Need,
    NodeBin,
    compute_capacity,
    core_units,
)
from hypersack.sampler.profiles import load_profiles
from hypersack.store import MemoryStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def first_decision(space_data: object, cluster: str, ratio: float | None = None,
                   fusion: bool = False, profiles: list[Profile] | None = None
                   ) -> tuple[list[Item], ClusterView]:
    """The pending trials and the empty cluster of a study's first decision (trials
    alone, as the paper packs them, unless `fusion`)."""
    decision = submitted(space_data, cluster, ratio, fusion, profiles).decisions[-1]
    return list(decision.batch), decision.view


def submitted(space_data: object, cluster: str, ratio: float | None = None,
              fusion: bool = False, profiles: list[Profile] | None = None) -> Orchestrator:
    """An orchestrator (`profiles`, by default the example estimated ones; manual clock)
    with the cluster's nodes joined and the study submitted, its first decision taken."""
    space = (load_space(space_data) if isinstance(space_data, (str, Path))
             else parse_space(space_data))
    if not fusion:
        space = space.model_copy(update={"settings": space.settings.model_copy(
            update={"fusion": "off"})})
    if ratio is not None:
        space = space.model_copy(update={"settings": space.settings.model_copy(
            update={"oversubscription": {"A100": ratio, "H100": ratio}})})
    store = MemoryStore()
    if profiles is None:
        profiles = load_profiles(EXAMPLES / "profiles-estimates.yaml")
    for p in profiles:
        store.put_profile(p)
    orch = Orchestrator(store, ManualClock(0.0))
    for node in parse_shorthand(cluster).nodes:
        orch.handle(NodeJoined(node))
    orch.handle(StudySubmitted(space))
    return orch


# Heterogeneous instances: A100-40GB and H100-80GB nodes mixed, oversubscription 3 and
# 2.5, and workload mixes that bind a different resource each. Every workload has a
# profile on both architectures: on the H100 it needs 70-90 % of the A100's percent and
# runs in 50-80 % of its time.
MIXES = ("compute", "memory", "cpu", "mixed")
HETERO_RATIOS = {"A100": 3.0, "H100": 2.5}


def heterogeneous(mix: str, seed: int, scale: int = 1) -> tuple[list[Item], ClusterView]:
    """A heterogeneous instance: `scale` x (2 nodes of 4 A100-40GB with 32 cores, 2 nodes
    of 4 H100-80GB with 48 cores), and about twice as much work as fits."""
    rng = random.Random(f"{mix}-{seed}")
    view = _nodes(["A100" if n % 4 < 2 else "H100" for n in range(4 * scale)], 4)
    kinds = (mix,) * 16 if mix != "mixed" else ("compute", "memory", "cpu") * 6
    return _items(rng, kinds, view, 2.0, (4, 24)), view


# Other shapes than `heterogeneous`'s, for checks that tuning saw none of: each a cluster
# (node architectures, GPUs per node), trials per class (min, max), and work offered as a
# multiple of what fits.
SHAPES: dict[str, tuple[tuple[str, ...], int, tuple[int, int], float]] = {
    "unique-16": (("A100", "H100") * 2, 4, (1, 1), 2.0),  # every trial a class of its own
    "few-4": (("A100", "H100"), 2, (2, 8), 2.0),  # 4 GPUs
    "a100-only-32": (("A100",) * 4, 8, (4, 24), 2.0),  # one architecture, 8 GPUs a node
    "big-classes-16": (("A100", "H100") * 2, 4, (20, 60), 2.0),
    "tight-16": (("A100", "H100") * 2, 4, (4, 24), 1.2),  # little more than fits
}


def shaped(shape: str, mix: str, seed: int) -> tuple[list[Item], ClusterView]:
    """An instance of one of SHAPES, its trials drawn as `heterogeneous` draws them."""
    archs, gpus, copies, work = SHAPES[shape]
    rng = random.Random(f"shape-{shape}-{mix}-{seed}")
    view = _nodes(list(archs), gpus)
    kinds = (mix,) if mix != "mixed" else ("compute", "memory", "cpu")
    return _items(rng, kinds, view, work, copies), view


def _nodes(archs: list[str], gpus: int) -> ClusterView:
    """One node per entry: A100-40GB with 32 cores or H100-80GB with 48, `gpus` each."""
    nodes = []
    for n, arch in enumerate(archs):
        mem, cores = (40960, 32) if arch == "A100" else (81920, 48)
        cap = compute_capacity(HETERO_RATIOS[arch])
        bins = tuple(GpuBin(f"n{n}", g, arch, cap, mem, cap, mem) for g in range(gpus))
        nodes.append(NodeBin(f"n{n}", core_units(cores), bins, core_units(cores)))
    return ClusterView(tuple(nodes))


def _items(rng: random.Random, kinds: tuple[str, ...], view: ClusterView, work: float,
           copies: tuple[int, int]) -> list[Item]:
    """Classes of trials (each `copies` trials alike) of the kinds drawn, until their
    A100 compute is `work` times the cluster's. Every workload has a need on both
    architectures: on the H100 70-90 % of the A100's percent."""
    capacity = sum(g.compute for node in view.nodes for g in node.gpus)
    items: list[Item] = []
    total = 0
    while total < work * capacity:
        kind = rng.choice(kinds)
        if kind == "compute":
            pct, mib, cores = rng.uniform(20, 90), rng.uniform(1024, 10240), rng.choice((1, 2, 3))
        elif kind == "memory":
            pct, mib, cores = rng.uniform(10, 60), rng.uniform(6144, 36864), rng.choice((1, 2))
        else:
            pct, mib, cores = rng.uniform(10, 50), rng.uniform(1024, 6144), rng.randint(2, 12)
        fast = rng.uniform(0.7, 0.9)
        needs = {"A100": Need(round(pct * 100), round(mib), cores * 1000),
                 "H100": Need(round(pct * fast * 100), round(mib), cores * 1000)}
        run = rng.uniform(100, 3000)
        for _ in range(rng.randint(*copies)):
            items.append(Item(f"t{len(items)}", needs, run_time_s=run))
            total += needs["A100"].compute
    return items


TRANSFORMERS = ("vit_tiny", "deit_tiny")


def speedup_profiles(fast: float, slow: float) -> list[Profile]:
    """The example estimates with each H100 iteration time set from the A100's by model
    family: the transformers (TRANSFORMERS) run `fast` times faster on an H100 than on
    an A100, every other model `slow` times. Demands stay the estimates'."""
    base = load_profiles(EXAMPLES / "profiles-estimates.yaml")
    a100 = {p.key: p for p in base if p.arch == "A100"}
    out = []
    for p in base:
        if p.arch == "H100" and p.key in a100:
            gain = fast if p.key.model in TRANSFORMERS else slow
            p = p.model_copy(update={"iter_time_s": a100[p.key].iter_time_s / gain})
        out.append(p)
    return out
