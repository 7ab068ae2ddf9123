#!/usr/bin/env python3
"""Which policy ends studies soonest, beyond the paper's studies: the simulator's
makespan (the real orchestrator, virtual time, the interference model) of SP1's 96
trials for every registered greedy policy, `eft`, `pack`, `auto` and the default
`predict` (the rule whose simulated study ends first), per scenario, and the default's
ratio to the best policy's makespan in that scenario.

Scenarios: cluster x study kind x fusion x seed.
- clusters: `paper` (4 A100-80GB + 2 H100-80GB), `mixed40` (8 A100-40GB with 32 cores a
  node + 8 H100-80GB with 48, in nodes of four);
- kinds (the example estimated profiles, each perturbed by the seed: iteration time
  x0.8-1.25, compute x0.8-1.2):
  `compute` as they are (compute-bound, the paper's);
  `memory`: 10-40 % compute, 10-30 GiB each (two or three fit an A100-40GB);
  `cores`: 10-40 % compute, 6-16 cores each (the nodes' cores bind);
- fusion on and off (the study's `settings.fusion`); seeds 0 and 1 (`--seeds`).

`predict` simulates the study with what the scheduler knows. Without `--noise` that is
the truth, so its simulations are the runs measured here, and it takes the best of its
candidates by construction. `--noise X` hides an error from it: each workload's real
iteration time is its profile's times a factor drawn from [1 - X, 1 + X] (per workload
and seed), which the scheduler never sees, as profiles measured over ten iterations
err on a real cluster.

`optimal` (CP-SAT) is left out: a decision takes it seconds, and the simulator makes
hundreds. Prints one row per scenario and the summary: the default's worst and mean
ratio to the best, how often each policy was the best, and per policy the GPU-seconds
during which a GPU held nothing while a waiting trial fit it (work conservation: 0 means
no decision left a GPU idle that a trial in the queue could have used).

    python scripts/sim_makespan.py                   # 24 scenarios x 7 policies
    python scripts/sim_makespan.py --kinds memory --seeds 1
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from _instances import EXAMPLES

from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import Profile
from hypersack.grid.settings import Settings
from hypersack.grid.space import load_space, parse_space
from hypersack.orchestrator import OrchestratorConfig
from hypersack.policies import policy_names
from hypersack.sampler.profiles import load_profiles
from hypersack.sim.foresight import foresee
from hypersack.sim.simulator import Simulation

CLUSTERS = {"paper": "1x4xA100-80GB@88,1x2xH100-80GB@96",
            "mixed40": "2x4xA100-40GB@32,2x4xH100-80GB@48"}
KINDS = ("compute", "memory", "cores")
POLICIES = ("ff", "ffd", "wf", "wfd", "eft", "pack", "auto", "predict")
DEFAULT = Settings().policy  # the default policy, whichever it is


def profiles(kind: str, seed: int) -> list[Profile]:
    """The example estimates, perturbed by the seed and bent to bind `kind`. A workload
    keeps one draw across architectures (its H100 profile scaled like its A100 one)."""
    rng = random.Random(f"{kind}-{seed}")
    draws: dict[object, tuple[float, float, float, float]] = {}
    out = []
    for p in load_profiles(EXAMPLES / "profiles-estimates.yaml"):
        key = (p.key.model, p.key.batch_size)
        if key not in draws:
            draws[key] = (rng.uniform(0.8, 1.25), rng.uniform(0.8, 1.2),
                          rng.uniform(10 * 1024, 30 * 1024), rng.uniform(6, 16))
        time_x, compute_x, memory, cores = draws[key]
        demand = p.demand.model_copy(update={"compute_pct": min(100.0, p.demand.compute_pct
                                                                * compute_x)})
        if kind == "memory":
            demand = demand.model_copy(update={
                "compute_pct": min(40.0, max(10.0, demand.compute_pct * 0.6)),
                "memory_mib": int(memory)})
        elif kind == "cores":
            demand = demand.model_copy(update={
                "compute_pct": min(40.0, max(10.0, demand.compute_pct * 0.6)),
                "cores": round(cores)})
        out.append(p.model_copy(update={"demand": demand,
                                        "iter_time_s": p.iter_time_s * time_x}))
    return out


def hidden_error(known: list[Profile], noise: float, seed: int) -> list[Profile]:
    """The real profiles behind `known`: each workload's iteration time times a factor
    from [1 - noise, 1 + noise], one per workload (on every architecture)."""
    rng = random.Random(f"noise-{seed}")
    factor: dict[object, float] = {}
    out = []
    for p in known:
        key = (p.key.model, p.key.batch_size)
        if key not in factor:
            factor[key] = rng.uniform(1 - noise, 1 + noise)
        out.append(p.model_copy(update={"iter_time_s": p.iter_time_s * factor[key]}))
    return out


def makespans(cluster: str, kind: str, fusion: bool, seed: int, policies: tuple[str, ...],
              idle: dict[str, float] | None = None, noise: float = 0.0) -> dict[str, float]:
    """Each policy's makespan; `idle` adds up each one's GPU-seconds idle while a waiting
    trial fit (SimResult.idle_fit_s). With `noise`, the trials run as hidden_error's
    profiles say while the scheduler knows the drawn ones."""
    data = load_space(str(EXAMPLES / "sp1.yaml")).model_dump(mode="json", exclude_defaults=True)
    data["settings"] = {**data.get("settings", {}), "fusion": "on" if fusion else "off"}
    data["settings"].pop("policy", None)
    space = parse_space(data)
    known = profiles(kind, seed)
    truth = hidden_error(known, noise, seed) if noise else known
    out = {}
    for policy in policies:
        config = OrchestratorConfig(policy=policy, fusion=fusion, foresight=foresee)
        r = Simulation(space, parse_shorthand(CLUSTERS[cluster]), truth, config=config,
                       history=known).run()
        if r.completed != 96:
            raise RuntimeError(f"{cluster} {kind} {policy}: {r.completed} of 96 completed")
        out[policy] = r.makespan_s
        if idle is not None:
            idle[policy] = idle.get(policy, 0.0) + r.idle_fit_s
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=0,
                    help="seeds --first-seed .. --first-seed + --seeds - 1")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--noise", type=float, default=0.0,
                    help="hidden error of the profiles' iteration times, 0 to 0.9: each "
                         "workload's real time is its profile's x U(1 - X, 1 + X)")
    args = ap.parse_args()
    policies = tuple(args.policies.split(","))
    if args.seeds < 1 or args.first_seed < 0:
        ap.error("--seeds must be at least 1 and --first-seed at least 0")
    if not 0.0 <= args.noise <= 0.9:
        ap.error("--noise must lie in [0, 0.9]")
    for flag, given, valid in (("--clusters", args.clusters.split(","), tuple(CLUSTERS)),
                               ("--kinds", args.kinds.split(","), KINDS),
                               ("--policies", policies, tuple(policy_names()))):
        unknown = [x for x in given if x not in valid]
        if unknown:
            ap.error(f"{flag}: unknown {', '.join(unknown)}; valid: {', '.join(valid)}")
    print(f"{'cluster':<8}{'kind':<8}{'fusion':<7}{'seed':<5}"
          + "".join(f"{p:>9}" for p in policies) + f"  {DEFAULT}/best  best")
    # Each policy's ratio to the best, per scenario (the default's is the column).
    ratios: dict[str, list[float]] = {p: [] for p in policies}
    wins: dict[str, int] = {p: 0 for p in policies}
    idle: dict[str, float] = {}
    began = time.perf_counter()
    for cluster in args.clusters.split(","):
        for kind in args.kinds.split(","):
            for fusion in (True, False):
                for seed in range(args.first_seed, args.first_seed + args.seeds):
                    m = makespans(cluster, kind, fusion, seed, policies, idle, args.noise)
                    best = min(m.values())
                    for p, v in m.items():
                        wins[p] += v <= best * 1.0001
                    for p, v in m.items():
                        ratios[p].append(v / best)
                    ratio = m[DEFAULT] / best if DEFAULT in m else float("nan")
                    winner = min(m, key=m.__getitem__)
                    print(f"{cluster:<8}{kind:<8}{'on' if fusion else 'off':<7}{seed:<5}"
                          + "".join(f"{m[p]:>9.0f}" for p in policies)
                          + f"  {ratio:>9.3f}  {winner}", flush=True)
    print()
    for p in policies:
        r = ratios[p]
        print(f"{p + (' (the default)' if p == DEFAULT else ''):<22} makespan / the best "
              f"policy's: worst {max(r):.3f}, mean {statistics.mean(r):.3f} over {len(r)} "
              f"scenarios; within 2 % in {sum(x <= 1.02 for x in r)}")
    print("scenarios where each policy was the best (ties count for each): "
          + ", ".join(f"{p} {n}" for p, n in wins.items()))
    print("GPU-seconds a GPU held nothing while a waiting trial fit it, over all scenarios: "
          + ", ".join(f"{p} {v:.0f}" for p, v in idle.items()))
    print(f"({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
