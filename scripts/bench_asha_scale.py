#!/usr/bin/env python3
"""What early stopping costs the control plane at scale: the simulator runs a study of
N trials (9 epochs, a learning-rate grid, stated demands) on 64 A100s with ASHA (rungs 1
and 3, pause mode) and without a pruner, and reports the wall time of the whole run per
event the orchestrator handled, ASHA's as a ratio to the no-pruner run's in the same
process. Each trial reports every epoch, so both runs handle a progress event per epoch.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import Demand, Profile, WorkloadKey
from hypersack.grid.space import parse_space
from hypersack.orchestrator import OrchestratorConfig
from hypersack.sim.simulator import Simulation

CLUSTER = "8x8xA100-80GB@256"


def space(n: int, pruner: bool) -> Any:
    data: dict[str, Any] = {
        "name": "scale", "models": ["resnet18"],
        "hyperparameters": {"batch_size": [64], "lr": {
            "distribution": "loguniform", "low": 1e-4, "high": 1.0, "num": n}},
        "settings": {"epochs": 9, "policy": "wfd", "fusion": "off"},
    }
    if pruner:
        data["pruner"] = {"type": "asha", "min_epochs": 1, "reduction_factor": 3}
    return parse_space(data)


def curve(params: dict[str, object], epoch: int) -> float:
    lr = float(params["lr"])  # type: ignore[arg-type]
    return 0.3 + 0.1 * (math.log10(lr) + 2.5) ** 2 + 1.0 / math.sqrt(epoch)


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def count(self, _at: float, _event: object) -> None:
        self.n += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,3000,10000")
    args = parser.parse_args()
    truth = [Profile(key=WorkloadKey(model="resnet18", batch_size=64), arch="A100",
                     demand=Demand(compute_pct=25, memory_mib=1000, cores=1),
                     iter_time_s=0.01, iters_per_epoch=1000)]
    cluster = parse_shorthand(CLUSTER)
    print(f"{'trials':>7}{'run':>10}{'events':>9}{'wall s':>9}{'us/event':>10}{'ratio':>7}")
    for n in (int(x) for x in args.sizes.split(",")):
        base = None
        for name, pruner in (("none", False), ("asha", True)):
            events = Counter()
            sim = Simulation(space(n, pruner), cluster, truth,
                             config=OrchestratorConfig(fusion=False), curve=curve,
                             on_event=events.count)
            t0 = time.perf_counter()
            r = sim.run()
            wall = time.perf_counter() - t0
            per = wall / max(1, events.n) * 1e6
            base = base or per
            print(f"{n:>7}{name:>10}{events.n:>9}{wall:>9.2f}{per:>10.1f}{per / base:>7.2f}"
                  + ("  STUCK" if r.stuck else ""), flush=True)


if __name__ == "__main__":
    main()
