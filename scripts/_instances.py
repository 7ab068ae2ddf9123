"""Shared by the benchmarks: puts the checkout on the path and re-exports the instances
(`hypersack.sim.instances`)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypersack.sim.instances import (
    EXAMPLES,
    HETERO_RATIOS,
    MIXES,
    ROOT,
    SHAPES,
    first_decision,
    heterogeneous,
    shaped,
)

__all__ = ["EXAMPLES", "HETERO_RATIOS", "MIXES", "ROOT", "SHAPES", "first_decision",
           "heterogeneous", "shaped"]
