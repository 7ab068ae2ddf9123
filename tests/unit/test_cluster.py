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
