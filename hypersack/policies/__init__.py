"""Placement policies: pure functions of a snapshot, `place(items, cluster) -> Plan`."""

from hypersack.policies.base import ClusterView, GpuBin, Item, Need, NodeBin, Placement, Plan
from hypersack.policies.registry import make_policy, policy_names, register_policy

__all__ = ["ClusterView", "GpuBin", "Item", "Need", "NodeBin", "Placement", "Plan",
           "make_policy", "policy_names", "register_policy"]
