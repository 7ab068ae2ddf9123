"""One fit rule: `ClusterState.shortfalls` is what every question of fit asks
(reservations, preemption, `why`), and the flat arrays the policies place with (built
from the cluster's view) answer exactly as it does, on random clusters and needs."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hypersack.core.types import Demand, GpuSpec, NodeRecord, NodeSpec
from hypersack.orchestrator.cluster import ClusterState
from hypersack.orchestrator.config import OrchestratorConfig
from hypersack.orchestrator.journal import Journal
from hypersack.policies.base import Flat, Need, compute_capacity

ARCHS = ("A100", "H100")

gpus = st.lists(st.tuples(st.sampled_from(ARCHS), st.sampled_from([40960, 81920]),
                          st.sampled_from(["free", "profiling", "draining"])),
                min_size=1, max_size=3)
nodes = st.lists(st.tuples(gpus, st.integers(2, 16)), min_size=1, max_size=3)
demands = st.lists(st.tuples(st.integers(0, 2), st.floats(0, 150), st.integers(0, 50000),
                             st.floats(0, 6)), max_size=12)
needs = st.lists(st.builds(Need, st.integers(0, 30000), st.integers(0, 90000),
                           st.integers(0, 17000)), min_size=1, max_size=6)


@settings(max_examples=300, deadline=None)
@given(nodes=nodes, demands=demands, needs=needs, exclusive=st.booleans(),
       ratios=st.fixed_dictionaries({}, optional={"A100": st.sampled_from([1.0, 2.0, 3.0]),
                                                  "H100": st.sampled_from([1.0, 2.5])}))
def test_the_flat_arrays_answer_as_the_fit_rule(
        nodes: list[tuple[list[tuple[str, int, str]], int]],
        demands: list[tuple[int, float, int, float]], needs: list[Need], exclusive: bool,
        ratios: dict[str, float]) -> None:
    config = OrchestratorConfig(exclusive=exclusive)
    cluster = ClusterState(Journal(), config.ratio, exclusive)
    for n, (specs, cores) in enumerate(nodes):
        spec = NodeSpec(name=f"n{n}", cores=cores, gpus=tuple(
            GpuSpec(index=i, arch=arch, memory_mib=memory, uuid=f"n{n}-{i}")
            for i, (arch, memory, _) in enumerate(specs)))
        node = cluster.add(NodeRecord(spec=spec, draining=False), 0.0)
        for i, (_, _, job) in enumerate(specs):
            if job == "profiling":
                cluster.profile_jobs.start(node, node.gpus[i], (None, "x"))  # type: ignore[arg-type]
            elif job == "draining":
                cluster.profile_jobs.reserve(node, node.gpus[i], (None, "x"))  # type: ignore[arg-type]
    open_nodes = cluster.open_nodes()
    every = [(node, gpu) for node in open_nodes for gpu in node.gpus.values()]
    for k, (where, compute, memory, cores) in enumerate(demands):
        # Allocations as restored or adopted: not checked, so GPUs may be over anything.
        node, gpu = every[where % len(every)]
        cluster.allocate(f"t{k}", node, gpu, Demand(compute_pct=compute, memory_mib=memory,
                                                    cores=cores))
    view = cluster.view(open_nodes, ratios)
    flat = Flat(view)
    bins = {(n.name, b.index): (n, b) for n in view.nodes for b in n.gpus}
    assert len(flat) == len(every)
    for g, (node, gpu) in enumerate(every):
        cap = compute_capacity(config.ratio(gpu.arch, ratios))
        node_bin, bin_ = bins[node.name, gpu.spec_index]
        for need in needs:
            assert flat.fits(g, need) == (not cluster.shortfalls(node, gpu, need, cap)), \
                (node.name, gpu.spec_index, need, cluster.shortfalls(node, gpu, need, cap))
            # Whether it could ever fit there: the rule on an empty GPU, as the view's
            # totals say (a profile job aside, which ends).
            ever = [s for s in cluster.shortfalls(node, gpu, need, cap, empty=True)
                    if s not in ("profiling", "draining")]
            assert (not ever) == (need.compute <= bin_.full_compute and
                                  need.memory <= bin_.full_memory and
                                  need.cores <= node_bin.full_cores)
