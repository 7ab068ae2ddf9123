"""Feedback: what running trials show about their workload's profile.

A trial's observed peaks are recorded in its profile, and the profile's demand rises
where they exceed it: memory to the observed peak plus a margin (or to what an
out-of-memory death showed), compute to the observed utilization when it exceeds the
demand by more than a tolerance (utilization is noisy). Demands never fall here.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from hypersack.core.bounds import MAX_COMPUTE_PCT, MAX_MEMORY_MIB
from hypersack.core.types import Demand, Profile

log = logging.getLogger(__name__)


def corrected(p: Profile, memory_mib: int, util_pct: float, trial_id: str, *,
              margin: float, tolerance: float, count: bool = False,
              oom_at: int | None = None) -> Profile | None:
    """The profile after a trial's observation (`count`: the trial ended, one more
    observed trial; `oom_at`: it died of out-of-memory holding that much), or None when
    nothing changes. The result is validated: nothing out of bounds comes back."""
    update: dict[str, Any] = {}
    if memory_mib > p.observed_memory_mib:
        update["observed_memory_mib"] = memory_mib
    if util_pct > p.observed_compute_pct:
        update["observed_compute_pct"] = round(util_pct, 2)
    if count:
        update["observed_trials"] = p.observed_trials + 1
    demand = p.demand
    notes = []
    if memory_mib > demand.memory_mib:
        if oom_at is not None:
            new = memory_mib
            why = f"trial {trial_id} ran out of memory at {oom_at} MiB"
        else:
            new = math.ceil(memory_mib * (1 + margin))
            why = f"trial {trial_id} used {memory_mib} MiB"
        notes.append(f"memory {demand.memory_mib} -> {new} MiB ({why})")
        demand = Demand(compute_pct=demand.compute_pct, memory_mib=min(new, MAX_MEMORY_MIB),
                        cores=demand.cores)
    if util_pct > demand.compute_pct * (1 + tolerance):
        notes.append(f"compute {demand.compute_pct:g} -> {util_pct:.4g} % (trial "
                     f"{trial_id} used {util_pct:.4g} %)")
        demand = Demand(compute_pct=min(round(util_pct, 2), MAX_COMPUTE_PCT),
                        memory_mib=demand.memory_mib, cores=demand.cores)
    if notes:
        update["demand"] = demand
        update["corrected"] = "; ".join(notes)
        log.info("profile of %s on %s corrected: %s", p.key.label(), p.arch,
                 update["corrected"])
    if not update:
        return None
    return Profile.model_validate({**dict(p), **update})
