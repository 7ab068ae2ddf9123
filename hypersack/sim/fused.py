"""A fused group's profile ESTIMATED from a trial alone, for the simulator and the example
profiles (docs/simulator.md). Real fused profiles are measured per width by the Sampler.

The model follows HFTA's observations: a trial alone leaves its GPU idle between
kernels (launch overhead, host work), and the K members of a fused group share those
gaps and one data pipeline while their kernels grow K-fold and run a little more
efficiently; fused memory is a fixed intercept plus a smaller slope per member.

    t_K    = t f + t (1 - f) ((1 - u) + K u e)      u: utilization alone / 100
    util_K = min(100, 100 K u e t (1 - f) / t_K)
    mem_K  = m (a + (1 - a) K)                      a: the intercept's share of m

with f the data-loading share of an iteration, e the efficiency of wider kernels
(0.85) and a = 0.4 (ResNet-18 on the CPU: 579 MiB alone, 372 MiB per member at K = 8).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from hypersack.core.types import Demand, Profile
from hypersack.orchestrator.fusion import fusable_model, fused_key

EFFICIENCY = 0.85
INTERCEPT = 0.4


def fused_estimate(single: Profile, width: int) -> Profile:
    """Width K of a workload, estimated from its profile alone (width 1)."""
    if single.key.fusion_width != 1:
        raise ValueError("estimate fused widths from a profile of width 1")
    t, f = single.iter_time_s, single.data_fraction
    u = min(1.0, single.demand.compute_pct / 100.0)
    gpu_s = t * (1.0 - f) * ((1.0 - u) + width * u * EFFICIENCY)
    iter_s = t * f + gpu_s
    util = min(100.0, 100.0 * width * u * EFFICIENCY * t * (1.0 - f) / iter_s)
    memory = math.ceil(single.demand.memory_mib * (INTERCEPT + (1.0 - INTERCEPT) * width))
    return single.model_copy(update={
        "key": fused_key(single.key, width),
        "demand": Demand(compute_pct=round(util, 1), memory_mib=memory,
                         cores=single.demand.cores),
        "iter_time_s": round(iter_s, 6),
        "data_fraction": round(t * f / iter_s, 4),
        "source": f"estimate (fused x{width} from {single.source or 'a profile alone'})",
        "observed_memory_mib": 0, "observed_compute_pct": 0.0, "observed_trials": 0,
        "corrected": "",
    })


def with_fused(profiles: Iterable[Profile], widths: Sequence[int] = (2, 4, 8)
               ) -> list[Profile]:
    """The profiles, plus an estimate of each fused width they lack."""
    out = list(profiles)
    known = {(p.key, p.arch) for p in out}
    for p in list(out):
        if p.key.fusion_width != 1 or not fusable_model(p.key.model):
            continue  # only the built-in trainer's models fuse
        for w in widths:
            key = fused_key(p.key, w)
            if (key, p.arch) not in known:
                out.append(fused_estimate(p, w))
                known.add((key, p.arch))
    return out
