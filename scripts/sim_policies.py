#!/usr/bin/env python3
"""Which policy finishes the paper's studies soonest: the simulator's makespan for SP1-SP4
with `wfd`, `auto` and `pack`, with fusion on and off, on the paper's
cluster (4 A100 + 2 H100), 4 A100 and 16 A100, with the example estimated profiles.
Each makespan is also given relative to `wfd`'s in the same run.

Placement quality per decision is `bench_policies.py`'s; this is the other side of the
trade: fuller GPUs interfere more, and the simulator charges for it.
"""

from __future__ import annotations

import argparse

from _instances import EXAMPLES

from hypersack.core.cluster import parse_shorthand
from hypersack.grid.space import load_space
from hypersack.orchestrator import OrchestratorConfig
from hypersack.sampler.profiles import load_profiles
from hypersack.sim.simulator import Simulation

CLUSTERS = {"paper": "1x4xA100-80GB@88,1x2xH100-80GB@96", "4xA100": "1x4xA100-80GB@88",
            "16xA100": "4x4xA100-80GB@88"}
RUNS = (("sp1", "paper"), ("sp2", "paper"), ("sp3", "paper"), ("sp1", "4xA100"),
        ("sp3", "4xA100"), ("sp4", "16xA100"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policies", default="wfd,auto,pack")
    args = parser.parse_args()
    policies = args.policies.split(",")
    truth = load_profiles(EXAMPLES / "profiles-estimates.yaml")
    print(f"{'space':<6}{'cluster':<9}{'fusion':<8}"
          + "".join(f"{p:>18}" for p in policies))
    for fusion in (True, False):
        for space_name, cluster in RUNS:
            space = load_space(str(EXAMPLES / f"{space_name}.yaml"))
            cells = []
            base = None
            for policy in policies:
                config = OrchestratorConfig(policy=policy, fusion=fusion)
                r = Simulation(space, parse_shorthand(CLUSTERS[cluster]), truth,
                               config=config).run()
                base = base or r.makespan_s
                cells.append(f"{r.makespan_s:>9.0f} s {r.makespan_s / base:>5.3f}")
            print(f"{space_name:<6}{cluster:<9}{'on' if fusion else 'off':<8}"
                  + "".join(f"{c:>18}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
