"""The view of the open nodes that ClusterState keeps across decisions (patched where
nodes changed, its columns joined once) is always the view built afresh, and the profile
jobs it keeps are those a walk of every GPU finds: over a random walk of joins, leaves,
drains, allocations, releases, profile jobs, ratio changes and undone batches, at two
sets of ratios at once."""

from __future__ import annotations

import random

from hypersack.core.types import Demand, GpuSpec, NodeRecord, NodeSpec
from hypersack.orchestrator.cluster import ClusterState
from hypersack.orchestrator.journal import Journal
from hypersack.policies.base import ClusterView, FitBounds, Flat, Item, Need, compute_capacity
from hypersack.policies.plans import check_plan
from hypersack.policies.registry import make_policy

ARCHS = ("A100", "H100")


def _same(kept: ClusterView, fresh: ClusterView) -> None:
    assert kept.columns() is not None and fresh.columns() is None  # the two paths
    assert kept.nodes == fresh.nodes
    a, b = Flat(kept), Flat(fresh)
    for name in ("node_names", "node_cores", "node_of", "arch", "index", "compute",
                 "memory", "slots"):
        assert getattr(a, name) == getattr(b, name), name
    k, f = FitBounds(kept), FitBounds(fresh)
    # The kept states are patched in step (see JoinedColumns.states); fresh ones sorted.
    assert k._counts == f._counts
    assert {a: s for a, s in k._states.items() if s} == f._states
    # The GPUs with room for a need: from the kept order (bisected), as a walk finds them.
    for compute in (0, 1, 40, 90, 150, 300, 10**6):
        roomy = a.roomy(compute)
        assert sorted(roomy) == b.roomy(compute), compute
        assert roomy == sorted(roomy, key=lambda g: (-a.compute[g], g))
    first = a.roomy(1)
    if first:  # once a policy took some, the kept order no longer says: the copy's own
        g = first[0]
        a.take(g, Need(a.compute[g], 0, 0))
        assert g not in a.roomy(1)
    for n in fresh.nodes:
        assert kept.node_named(n.name) == fresh.node_named(n.name) == n
    assert kept.node_named("nowhere") is None and fresh.node_named("nowhere") is None


def _same_plans(kept: ClusterView, fresh: ClusterView, rng: random.Random) -> None:
    """The policies that start from the GPUs with room decide alike on both paths."""
    needs = [{"A100": Need(c, m, k), "H100": Need(c - 10, m, k)}
             for c, m, k in ((40, 1000, 1), (90, 20000, 4), (120, 1000, 1))]
    items = [Item(f"i{i}", rng.choice(needs), run_time_s=rng.choice([10.0, 60.0]))
             for i in range(rng.randint(1, 30))]
    for name in ("wfd", "wf", "eft", "ffd"):
        policy = make_policy(name)
        on_kept, on_fresh = policy.place(items, kept), policy.place(items, fresh)
        assert on_kept.placements == on_fresh.placements, name
        check_plan(items, kept, on_kept)


def test_the_kept_view_is_always_the_view_built_afresh() -> None:
    rng = random.Random(3)
    ratios = {"A100": 3.0, "H100": 2.5}
    journal = Journal()
    cluster = ClusterState(journal, lambda arch, own: own.get(arch, ratios[arch]))
    running: dict[str, tuple[str, int, Demand]] = {}
    names = 0
    kept_views = 0
    previous = cluster.open_nodes()
    for step in range(1500):
        nodes = list(cluster)
        op = rng.random()
        if op < 0.08 or not nodes:
            spec = NodeSpec(name=f"n{names:03d}", cores=rng.choice([8, 88]), gpus=tuple(
                GpuSpec(index=i, arch=rng.choice(ARCHS), memory_mib=81920, uuid=f"{names}-{i}")
                for i in range(rng.randint(1, 4))))
            names += 1
            cluster.add(NodeRecord(spec=spec, draining=False), 0.0)
        elif op < 0.11:
            gone = rng.choice(nodes).name
            cluster.remove(gone)
            running = {t: r for t, r in running.items() if r[0] != gone}
        elif op < 0.14:
            node = rng.choice(nodes)
            cluster.set_draining(node, not node.draining)
        elif op < 0.55:
            node = rng.choice(nodes)
            index = rng.choice(sorted(node.gpus))
            gpu = node.gpus[index]
            demand = Demand(compute_pct=rng.choice([10.0, 40.0, 90.0]),
                            memory_mib=rng.choice([1000, 20000]), cores=rng.choice([1.0, 4.0]))
            cap = compute_capacity(ratios[gpu.arch])
            if not cluster.shortfalls(node, gpu, Need.of(demand), cap):
                tid = f"t{step}"
                cluster.allocate(tid, node, gpu, demand)
                running[tid] = (node.name, index, demand)
        elif op < 0.85 and running:
            tid = rng.choice(sorted(running))
            name, index, demand = running.pop(tid)
            cluster.release(tid, name, index, demand)
        elif op < 0.9:
            node = rng.choice(nodes)
            index = rng.choice(sorted(node.gpus))
            slot = (None, f"p{step}")
            if rng.random() < 0.5:
                cluster.profile_jobs.start(node, node.gpus[index], slot)  # type: ignore[arg-type]
            else:
                cluster.profile_jobs.reserve(node, node.gpus[index], slot)  # type: ignore[arg-type]
        elif op < 0.93:
            for node in nodes:
                for gpu in node.gpus.values():
                    for slot in (gpu.profiling, gpu.reserved_for):
                        if slot is not None:
                            cluster.profile_jobs.end(slot)
        elif op < 0.96:
            ratios = {"A100": rng.choice([2.0, 3.0]), "H100": rng.choice([1.5, 2.5])}
        else:
            # A batch that changes nodes and is undone: the nodes come back as they were.
            journal.begin()
            mark = journal.mark()
            before = dict(running)
            for tid in sorted(running)[:3]:
                name, index, demand = running.pop(tid)
                cluster.release(tid, name, index, demand)
            node = rng.choice(nodes)  # a profile job planned in the batch, undone with it
            cluster.profile_jobs.reserve(node, node.gpus[min(node.gpus)], (None, f"u{step}"))  # type: ignore[arg-type]
            cluster.profile_jobs.in_flight()
            journal.rollback_to(mark)
            journal.end()
            running = before
        for own in ({}, {"A100": 1.5}):
            open_nodes = cluster.open_nodes()
            kept = cluster.view(open_nodes, own)
            if kept.columns() is not None:
                kept_views += 1
                fresh = cluster.view(list(open_nodes), own)
                _same(kept, fresh)
                if step % 10 == 0:
                    _same_plans(kept, fresh, rng)
                assert cluster.view(open_nodes, own) is kept  # nothing changed: the same
        # The profile jobs in flight, kept between changes, are those a walk finds.
        gpus = [(n, g) for n in cluster for g in n.gpus.values()]
        assert cluster.profile_jobs.in_flight() == {
            s for _, g in gpus for s in (g.profiling, g.reserved_for) if s is not None}
        assert cluster.profile_jobs.any_reserved() == any(
            g.reserved_for is not None and not n.draining for n, g in gpus)
        # A list of the open nodes taken before a join, leave or drain (a decision cycle's
        # own) is another set of nodes: its view is built for it.
        assert cluster.view(previous, {}).nodes == cluster.view(list(previous), {}).nodes
        previous = cluster.open_nodes()
    assert kept_views > 2000


def test_a_list_from_before_a_membership_change_never_stands_for_the_open_nodes() -> None:
    """A decision cycle's own list of the open nodes, taken before a node left and
    another joined (as many as before), gets its own view, and the open nodes' view
    after it has the node that joined."""
    cluster = ClusterState(Journal(), lambda arch, own: 3.0)

    def join(name: str) -> None:
        spec = NodeSpec(name=name, cores=8, gpus=(
            GpuSpec(index=0, arch="A100", memory_mib=81920, uuid=name),))
        cluster.add(NodeRecord(spec=spec, draining=False), 0.0)

    join("a")
    join("b")
    before = cluster.open_nodes()
    cluster.view(before, {})
    cluster.remove("b")
    join("c")
    assert [n.name for n in cluster.view(before, {}).nodes] == ["a", "b"]
    assert [n.name for n in cluster.view(cluster.open_nodes(), {}).nodes] == ["a", "c"]
