"""Cluster descriptions: a YAML file or the shorthand `2x4xA100-80GB,1x2xH100-80GB@96`."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from hypersack.core.bounds import MAX_CORES, MAX_GPUS_PER_NODE, MAX_MEMORY_MIB, MAX_NODES, finite
from hypersack.core.errors import InvalidInput
from hypersack.core.files import load_yaml_file
from hypersack.core.types import ClusterSpec, GpuSpec, NodeSpec
from hypersack.core.validation import format_validation_error

DEFAULT_CORES_PER_GPU = 24

_TERM = re.compile(
    r"^(?:(?P<nodes>\d+)x)?(?P<gpus>\d+)x(?P<arch>[A-Za-z][A-Za-z0-9_.]*?)"
    r"-(?P<mem>\d+(?:\.\d+)?)GB(?:@(?P<cores>\d+(?:\.\d+)?))?$"
)


def parse_shorthand(text: str, *, first_node: int = 0) -> ClusterSpec:
    """`[NODES x] GPUS x ARCH-MEMGB [@CORES]`, comma-separated.

    `2x4xA100-80GB` is two nodes of four A100 with 80 GB each; `@88` sets the node's
    cores (default: 24 per GPU). Nodes are named node0, node1, ... in order.
    """
    nodes: list[NodeSpec] = []
    terms = [t.strip() for t in text.split(",") if t.strip()]
    if not terms:
        raise InvalidInput("empty cluster shorthand; example: 2x4xA100-80GB,1x2xH100-80GB@96")
    for term in terms:
        m = _TERM.match(term)
        if m is None:
            raise InvalidInput(
                f"cluster shorthand term {term!r} is not NODESxGPUSxARCH-MEMGB[@CORES] "
                "(example: 2x4xA100-80GB@88)"
            )
        n_nodes = int(m["nodes"] or 1)
        n_gpus = int(m["gpus"])
        if not 1 <= n_nodes <= MAX_NODES - len(nodes):
            raise InvalidInput(f"cluster shorthand term {term!r}: between 1 and {MAX_NODES} "
                               "nodes in all")
        if not 1 <= n_gpus <= MAX_GPUS_PER_NODE:
            raise InvalidInput(f"cluster shorthand term {term!r}: between 1 and "
                               f"{MAX_GPUS_PER_NODE} GPUs per node")
        memory_mib = int(finite(float(m["mem"]) * 1024, f"cluster shorthand term {term!r}: "
                                "memory in MiB", 1, MAX_MEMORY_MIB))
        cores = (finite(float(m["cores"]), f"cluster shorthand term {term!r}: cores",
                        0.001, MAX_CORES)
                 if m["cores"] else float(DEFAULT_CORES_PER_GPU * n_gpus))
        for _ in range(n_nodes):
            name = f"node{first_node + len(nodes)}"
            gpus = tuple(
                GpuSpec(index=i, arch=m["arch"], memory_mib=memory_mib, uuid=f"{name}-gpu{i}")
                for i in range(n_gpus)
            )
            nodes.append(NodeSpec(name=name, cores=cores, gpus=gpus))
    return ClusterSpec(nodes=tuple(nodes))


def cluster_from_dict(data: Any, *, source: str = "cluster") -> ClusterSpec:
    """The YAML form: `nodes: [{name, cores, gpus: [{arch, memory_mib}] | "4xA100-80GB"}]`."""
    if not isinstance(data, dict) or "nodes" not in data:
        raise InvalidInput(f"{source}: expected a mapping with a 'nodes' list")
    raw_nodes = data["nodes"]
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise InvalidInput(f"{source}: nodes: expected a non-empty list")
    if len(raw_nodes) > MAX_NODES:
        raise InvalidInput(f"{source}: nodes: more than {MAX_NODES}")
    nodes: list[dict[str, Any]] = []
    for i, raw in enumerate(raw_nodes):
        if not isinstance(raw, dict):
            raise InvalidInput(f"{source}: nodes.{i}: expected a mapping")
        node = dict(raw)
        gpus = node.get("gpus")
        if isinstance(gpus, str):
            short = parse_shorthand(gpus).nodes
            if len(short) != 1:
                raise InvalidInput(
                    f"{source}: nodes.{i}.gpus: give one node's GPUs, like 4xA100-80GB")
            node["gpus"] = [g.model_dump() for g in short[0].gpus]
        elif isinstance(gpus, list):
            if len(gpus) > MAX_GPUS_PER_NODE:
                raise InvalidInput(f"{source}: nodes.{i}.gpus: more than {MAX_GPUS_PER_NODE}")
            node["gpus"] = [
                {"index": j, **g} if isinstance(g, dict) and "index" not in g else g
                for j, g in enumerate(gpus)
            ]
        node.setdefault("name", f"node{i}")
        if "cores" not in node and isinstance(node.get("gpus"), list) and node["gpus"]:
            node["cores"] = DEFAULT_CORES_PER_GPU * max(1, len(node["gpus"]))
        nodes.append(node)
    try:
        spec = ClusterSpec.model_validate({"nodes": nodes})
    except ValidationError as exc:
        raise InvalidInput(format_validation_error(exc, source)) from None
    validate_cluster(spec, source=source)
    return spec


def validate_cluster(spec: ClusterSpec, *, source: str = "cluster") -> None:
    seen: set[str] = set()
    for node in spec.nodes:
        if node.name in seen:
            raise InvalidInput(f"{source}: duplicate node name {node.name!r}")
        seen.add(node.name)
        if not node.gpus:
            raise InvalidInput(f"{source}: node {node.name!r} has no GPUs")
        indices = [g.index for g in node.gpus]
        if len(set(indices)) != len(indices):
            raise InvalidInput(f"{source}: node {node.name!r} has duplicate GPU indices {indices}")


def load_cluster(text_or_path: str) -> ClusterSpec:
    """A path to a YAML file, or the shorthand itself."""
    path = Path(text_or_path)
    if path.suffix in (".yaml", ".yml", ".json") or (text_or_path and path.exists()):
        return cluster_from_dict(load_yaml_file(path, "cluster file"), source=str(path))
    return parse_shorthand(text_or_path)


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def near_miss(name: str, arch: str) -> bool:
    """Whether `name` is another spelling of architecture `arch` (`a100`, `A100-80GB`
    for A100): architectures are matched exactly, so such a name applies to no GPU."""
    folded, target = name.casefold(), arch.casefold()
    return name != arch and (folded == target or folded.startswith(target + "-"))
