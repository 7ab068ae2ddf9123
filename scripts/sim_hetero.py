#!/usr/bin/env python3
"""Heterogeneity-aware placement against the architecture-blind rule, in the simulator
(the real orchestrator, virtual time).

The example estimates give every model the same gain from an H100 (0.6x the A100's
iteration time), and then no placement can do better than another by choosing the
architecture. Here the H100 gains differ by model, as they do on real hardware where
transformers use the H100's newer tensor cores and small convolutional networks are
bound by their input pipeline: the transformers (vit_tiny, deit_tiny) run `--fast`
times faster on an H100 than on an A100, the convolutional networks `--slow` times.
Demands stay the example estimates'.

For each policy (wfd, eft, the default, and pack) and each of six scenarios (clusters,
speedups, epochs) it runs SP1 with `hetero` off (the paper's blind rule) and on, and
prints the makespans, their ratio, and the share of the transformers' trial time spent
on H100s. `pack` has a time budget, so its plans (and makespans) vary a little between
runs; the greedy rules are deterministic.
"""

from __future__ import annotations

import argparse

from _instances import EXAMPLES

from hypersack.core.cluster import parse_shorthand
from hypersack.grid.space import load_space, parse_space
from hypersack.orchestrator import OrchestratorConfig
from hypersack.sim.instances import TRANSFORMERS, speedup_profiles
from hypersack.sim.simulator import Simulation

PAPER = "1x4xA100-80GB@88,1x2xH100-80GB@96"
# (cluster, transformers' H100 speedup, convolutional networks', epochs)
SCENARIOS = ((PAPER, 3.0, 1.2, 5.0), (PAPER, 2.0, 1.3, 5.0), (PAPER, 3.0, 1.2, 15.0),
             ("2x4xA100-80GB@88,1x4xH100-80GB@96", 3.0, 1.2, 5.0),
             ("2x4xA100-80GB@88,1x4xH100-80GB@96", 2.0, 1.3, 10.0),
             ("1x4xA100-80GB@88,1x4xH100-80GB@96", 2.5, 1.1, 5.0))


def compare(cluster_text: str, fast: float, slow: float, epochs: float,
            policies: tuple[str, ...]) -> dict[str, tuple[float, float, float, float]]:
    """Per policy: blind and aware makespan, and the share of the transformers' trial
    time spent on H100s under each."""
    cluster = parse_shorthand(cluster_text)
    data = load_space(str(EXAMPLES / "sp1.yaml")).model_dump(mode="json", exclude_defaults=True)
    data["settings"] = {**data.get("settings", {}), "epochs": epochs, "fusion": "off"}
    space = parse_space(data)
    truth = speedup_profiles(fast, slow)
    out = {}
    for policy in policies:
        makespan = {}
        share = {}
        for hetero in (False, True):
            config = OrchestratorConfig(policy=policy,
                                        policy_options={policy: {"hetero": hetero}})
            r = Simulation(space, cluster, truth, config=config).run()
            makespan[hetero] = r.makespan_s
            on_h100 = {True: 0.0, False: 0.0}
            arch = {(node, index): a for node, index, a in r.gpus}
            for seg in r.timeline:
                if seg.model in TRANSFORMERS and seg.outcome == "COMPLETED":
                    on_h100[arch[seg.node, seg.gpu_index] == "H100"] += seg.end_s - seg.start_s
            total = sum(on_h100.values())
            share[hetero] = on_h100[True] / total if total else 0.0
        out[policy] = (makespan[False], makespan[True], share[False], share[True])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fast", type=float, help="the transformers' speedup on an H100 "
                        "over an A100 (with --slow and --cluster: one scenario of your own)")
    parser.add_argument("--slow", type=float, help="the convolutional networks' speedup")
    parser.add_argument("--epochs", type=float, default=5.0)
    parser.add_argument("--cluster", default=PAPER, help="shorthand (default: the paper's)")
    parser.add_argument("--policies", default="wfd,eft,pack")
    args = parser.parse_args()
    scenarios = SCENARIOS
    if args.fast is not None or args.slow is not None:
        scenarios = ((args.cluster, args.fast or 1.67, args.slow or 1.67, args.epochs),)
    policies = tuple(args.policies.split(","))
    print("SP1 without fusion; makespan with hetero off (blind) and on (aware); the share "
          "of the transformers' trial time spent on H100s")
    print(f"{'cluster':<36}{'fast':>5}{'slow':>5}{'ep':>4}  {'policy':<6}{'blind s':>9}"
          f"{'aware s':>9}{'ratio':>7}{'H100 share':>18}")
    for cluster, fast, slow, epochs in scenarios:
        for policy, (blind, aware, s0, s1) in compare(cluster, fast, slow, epochs,
                                                       policies).items():
            print(f"{cluster:<36}{fast:>5g}{slow:>5g}{epochs:>4g}  {policy:<6}{blind:>9.0f}"
                  f"{aware:>9.0f}{aware / blind:>7.3f}{s0:>10.1%} -> {s1:.1%}", flush=True)


if __name__ == "__main__":
    main()
