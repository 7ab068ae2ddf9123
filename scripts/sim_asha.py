#!/usr/bin/env python3
"""Early stopping and packing in the simulator: ASHA on the paper's SP1 models with the
example profiles, 27 epochs, rungs at 1, 3 and 9 (reduction factor 3), on the paper's
cluster (4 A100 + 2 H100).

- `asha-aligned`: packed, `mode: pause`: every attempt runs one rung's segment, so the
  trials of a rung sharing a GPU reach it together, and the promoted ones are packed
  anew at each rung;
- `asha-unaligned`: packed, `mode: stop`: trials run on from the start and are stopped
  where they rank too low (what Optuna's and Ray's ASHA do); a packed GPU's members reach
  rungs whenever their own speed gets them there;
- `asha-window-30s`: as `asha-aligned`, with a rung's promotions held 30 s so that they
  resume together (`promotion_window_s`);
- `asha-aligned-fused`: as `asha-aligned`, with fused groups: a rung's trials of one
  model train in one process where that places more work (promotions too);
- `asha-one-per-gpu`: `mode: pause`, one trial per GPU (the usual ASHA deployment);
- `no-pruner`: packed, every trial to its last epoch (the reference).

Learning curves are synthetic and seeded by each trial's parameters: the loss falls as
floor + c / sqrt(epoch), with the floor set by the learning rate and the model, and
a little noise, so the ranking at a rung is not quite the final one. Reported: makespan
(and its ratio to `asha-aligned` in the same run), mean GPU occupancy (share of scaled
compute in use), epochs trained, and the best final loss found against the best of all
trials trained to the end (`no-pruner`).
"""

from __future__ import annotations

import argparse
import hashlib
import math
from dataclasses import replace
from typing import Any

from _instances import EXAMPLES

from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import TrialState
from hypersack.grid.space import load_space, parse_space
from hypersack.orchestrator import OrchestratorConfig
from hypersack.sampler.profiles import load_profiles
from hypersack.sim.simulator import Simulation

CLUSTER = "1x4xA100-80GB@88,1x2xH100-80GB@96"
MODEL_FLOOR = {"shufflenet": 0.42, "mobilenet_v2": 0.38, "vit_tiny": 0.55, "deit_tiny": 0.52,
               "resnet18": 0.30, "resnet34": 0.28}


def _noise(params: dict[str, Any], epoch: int, seed: int) -> float:
    text = f"{sorted(params.items())}|{epoch}|{seed}".encode()
    return int(hashlib.sha256(text).hexdigest()[:8], 16) / 0xFFFFFFFF - 0.5


def curve(seed: int) -> Any:
    def loss(params: dict[str, Any], epoch: int) -> float:
        lr = float(params["lr"])  # type: ignore[arg-type]
        floor = MODEL_FLOOR.get(str(params["model"]), 0.4) + 0.08 * (math.log10(lr) + 3) ** 2
        scale = 1.5 + 0.5 * _noise(params, 0, seed)
        return floor + scale / math.sqrt(epoch) + 0.02 * _noise(params, epoch, seed)
    return loss


def space(mode: str | None, epochs: int, window_s: float = 0.0, fusion: str = "auto") -> Any:
    data = load_space(str(EXAMPLES / "sp1-sleep.yaml")).model_dump(mode="json")
    data["settings"]["epochs"] = epochs
    data["settings"]["fusion"] = fusion
    data["program"] = {"builtin": "train"}
    if mode is not None:
        data["pruner"] = {"type": "asha", "min_epochs": 1, "reduction_factor": 3, "mode": mode,
                          "promotion_window_s": window_s}
    return parse_space(data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=27)
    parser.add_argument("--seeds", default="0,1,2")
    args = parser.parse_args()
    truth = load_profiles(EXAMPLES / "profiles-estimates.yaml")
    cluster = parse_shorthand(CLUSTER)
    runs = (("asha-aligned", "pause", False, 0.0), ("asha-aligned-fused", "pause", False, 0.0),
            ("asha-window-30s", "pause", False, 30.0),
            ("asha-unaligned", "stop", False, 0.0), ("asha-one-per-gpu", "pause", True, 0.0),
            ("no-pruner", None, False, 0.0))
    print(f"{'seed':<5}{'run':<18}{'makespan':>12}{'ratio':>7}{'occupancy':>11}"
          f"{'epochs':>8}{'best loss':>11}{'of all':>9}")
    for seed in (int(s) for s in args.seeds.split(",")):
        base = None
        loss = curve(seed)
        best_all = None
        rows = []
        for name, mode, exclusive, window in runs:
            config = OrchestratorConfig(fusion=name.endswith("-fused"))
            if exclusive:
                config = replace(config, exclusive=True)
            sim = Simulation(space(mode, args.epochs, window,
                                   "on" if name.endswith("-fused") else "auto"),
                             cluster, truth, config=config, curve=loss)
            r = sim.run()
            trials = sim.orchestrator.trials()
            done = [t for t in trials if t.state == TrialState.COMPLETED]
            best = min((t.objective for t in done if t.objective is not None),
                       default=math.inf)
            epochs = sum(max([*t.rungs, 0]) if t.state == TrialState.PRUNED else t.epochs
                         for t in trials)
            if mode is None:
                best_all = best
            base = base or r.makespan_s
            rows.append((name, r.makespan_s, r.makespan_s / base, r.mean_occupancy, epochs,
                         best, r.stuck))
        for name, makespan, ratio, occ, epochs, best, stuck in rows:
            print(f"{seed:<5}{name:<18}{makespan:>10.0f} s{ratio:>7.3f}{occ:>11.3f}"
                  f"{epochs:>8.0f}{best:>11.4f}{best - (best_all or 0):>+9.4f}"
                  + ("  STUCK" if stuck else ""), flush=True)


if __name__ == "__main__":
    main()
