from __future__ import annotations

from typing import Any

import pytest

from hypersack.core.cluster import load_cluster, parse_shorthand
from hypersack.core.errors import InvalidInput
from tests.conftest import EXAMPLES


def test_shorthand_nodes_gpus_arch_memory_cores() -> None:
    c = parse_shorthand("2x4xA100-80GB,1x2xH100-80GB@96")
    assert [n.name for n in c.nodes] == ["node0", "node1", "node2"]
    assert [len(n.gpus) for n in c.nodes] == [4, 4, 2]
    assert c.nodes[0].gpus[0].arch == "A100" and c.nodes[0].gpus[0].memory_mib == 81920
    assert c.nodes[0].cores == 96 and c.nodes[2].cores == 96
    assert c.gpu_count() == 10 and c.archs() == {"A100", "H100"}
    single = parse_shorthand("4xA100-40GB@128")
    assert len(single.nodes) == 1 and single.nodes[0].gpus[3].memory_mib == 40960


@pytest.mark.parametrize("bad", ["", "4xA100", "0x4xA100-80GB", "axbxA100-80GB", "4xA100-80GB@"])
def test_bad_shorthand_says_the_form(bad: str) -> None:
    with pytest.raises(InvalidInput):
        parse_shorthand(bad)


def test_yaml_cluster_matches_its_shorthand() -> None:
    c = load_cluster(str(EXAMPLES / "cluster-paper.yaml"))
    assert [n.name for n in c.nodes] == ["a100-0", "h100-0"]
    assert [g.arch for g in c.nodes[1].gpus] == ["H100", "H100"]
    assert [g.index for g in c.nodes[1].gpus] == [0, 1]
    assert c.nodes[0].cores == 88


def test_duplicate_node_names_are_rejected(tmp_path: Any) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("nodes:\n  - {name: a, gpus: 2xA100-80GB}\n  - {name: a, gpus: 2xA100-80GB}\n")
    with pytest.raises(InvalidInput, match="duplicate node name 'a'"):
        load_cluster(str(f))
    f.write_text("nodes:\n  - {name: a, cores: -1, gpus: 2xA100-80GB}\n")
    with pytest.raises(InvalidInput, match=r"nodes\.0\.cores"):
        load_cluster(str(f))


def test_the_cached_view_follows_every_change_rollback_and_ratio() -> None:
    # The orchestrator's view keeps a node's bins until the node changes; it must never
    # show a stale one: not after an allocation, a release, a rollback, nor for a study
    # with other ratios.
    from hypersack.core.types import Demand, NodeRecord
    from hypersack.orchestrator.cluster import ClusterState
    from hypersack.orchestrator.journal import Journal

    journal = Journal()
    state = ClusterState(journal, lambda arch, study: study.get(arch, 3.0))
    for spec in parse_shorthand("2x2xA100-80GB@16").nodes:
        state.add(NodeRecord(spec=spec), 0.0)
    nodes = state.open_nodes()

    def free(ratios: dict[str, float] | None = None) -> list[tuple[int, int, int]]:
        view = state.view(nodes, ratios or {})
        return [(g.compute, g.memory, n.cores) for n in view.nodes for g in n.gpus]

    empty = free()
    assert free() == empty and state.view(nodes, {}).nodes[0] is state.view(nodes, {}).nodes[0]
    node = nodes[0]
    state.allocate("t1", node, node.gpus[0], Demand(compute_pct=40.0, memory_mib=1000, cores=2))
    after = free()
    assert after[0] == (30000 - 4000, 81920 - 1000, 16000 - 2000)
    assert after[1][2] == 16000 - 2000 and after[2:] == empty[2:]
    journal.begin()
    mark = journal.mark()
    state.release("t1", node.name, 0, Demand(compute_pct=40.0, memory_mib=1000, cores=2))
    assert free() == empty
    journal.rollback_to(mark)
    journal.end()
    assert free() == after
    assert free({"A100": 2.0})[0][0] == 20000 - 4000 and free()[0][0] == 30000 - 4000
    state.seen(node, 5.0)  # a heartbeat changes nothing the view shows
    assert free() == after


def test_the_open_nodes_follow_joins_leaves_drains_and_rollbacks() -> None:
    # Kept between decision cycles (a thousand nodes sorted hundreds of times a second
    # cost a third of the server's core): never stale after a change or an undo.
    from hypersack.core.types import NodeRecord
    from hypersack.orchestrator.cluster import ClusterState
    from hypersack.orchestrator.journal import Journal

    journal = Journal()
    state = ClusterState(journal, lambda arch, study: study.get(arch, 3.0))
    a, b = parse_shorthand("1x2xA100-80GB@16,1x2xH100-80GB@16").nodes

    def names() -> list[str]:
        return [n.name for n in state.open_nodes()]

    state.add(NodeRecord(spec=b), 0.0)
    assert names() == ["node1"] and state.open_archs() == {"H100"}
    state.add(NodeRecord(spec=a), 0.0)
    assert names() == ["node0", "node1"] and state.open_archs() == {"A100", "H100"}
    assert state.open_gpus() == 4
    state.open_nodes().clear()  # the caller's own list
    assert names() == ["node0", "node1"]
    journal.begin()
    mark = journal.mark()
    state.set_draining(state.live("node1"), True)
    assert names() == ["node0"] and state.open_archs() == {"A100"} and state.open_gpus() == 2
    journal.rollback_to(mark)  # the batch that drained it is undone
    assert names() == ["node0", "node1"] and state.open_archs() == {"A100", "H100"}
    mark = journal.mark()
    state.remove("node0")
    assert names() == ["node1"]
    journal.rollback_to(mark)
    journal.end()
    assert names() == ["node0", "node1"]
