#!/usr/bin/env python3
"""The oversubscription ratio learned from observed slowdown, in the simulator (issue 38,
2): under hidden interference models unlike the one the configured ratios suit
(saturation twice or half the default; contention 0.1 and 0.5), each study's makespan
with the configured ratios (A100 3, H100 2.5), with the learned ratio starting from
them, and with the best fixed ratio of a sweep (both architectures scaled alike), on
the same studies and cluster. Fusion is off, so that the ratio alone decides packing.

    python scripts/sim_learned_ratio.py
    python scripts/sim_learned_ratio.py --studies sp1 --models sat-half --sweep 1,2,3,4
    python scripts/sim_learned_ratio.py --mix-shift-only

Then the mix shift: per-workload fits against one fit of every sample. A hidden model
where the transformers' kernels queue fully past half the default saturation and the
CNNs' for a fifth of an iteration; SP1's CNNs as one study, then its transformers as the
next (and the other way round), the learner going on from the first into the second:
the second study's makespan with each, the configured ratios and the best fixed ratio.
"""

from __future__ import annotations

import argparse
import sys

from _instances import EXAMPLES

from hypersack.core.cluster import parse_shorthand
from hypersack.grid.space import SearchSpace, load_space, parse_space
from hypersack.orchestrator import OrchestratorConfig
from hypersack.orchestrator.config import DEFAULT_RATIOS
from hypersack.orchestrator.sharing import RatioLearner
from hypersack.sampler.profiles import load_profiles
from hypersack.sim.interference import Interference
from hypersack.sim.simulator import Simulation

BASE = Interference()
MODELS = {
    "sat-double": Interference(saturation_pct={a: 2 * s for a, s in BASE.saturation_pct.items()}),
    "sat-half": Interference(saturation_pct={a: s / 2 for a, s in BASE.saturation_pct.items()}),
    "contention-0.1": Interference(contention=0.1),
    "contention-0.5": Interference(contention=0.5),
}
CLUSTER = "1x4xA100-80GB@88,1x2xH100-80GB@96"  # the paper's
TRUTH = load_profiles(EXAMPLES / "profiles-estimates.yaml")  # read once, for every run


CNNS = ["shufflenet", "mobilenet_v2", "resnet18", "resnet34"]
TRANSFORMERS = ["vit_tiny", "deit_tiny"]
RATES = 16  # the second study's learning rates: 4 x SP1's trials, several waves
SHIFT = Interference(saturation_pct={a: s / 2 for a, s in BASE.saturation_pct.items()},
                     queued={m: 0.2 for m in CNNS})


def makespan(space_name: str | SearchSpace, model: Interference, ratios: dict[str, float],
             learner: RatioLearner | None = None) -> tuple[float, Simulation]:
    """One run; a learner samples each GPU every 2 s of virtual time (a trial reports
    its iteration time each epoch; the studies here last minutes)."""
    space = load_space(str(EXAMPLES / f"{space_name}.yaml")) \
        if isinstance(space_name, str) else space_name
    sim = Simulation(space, parse_shorthand(CLUSTER), TRUTH,
                     config=OrchestratorConfig(oversubscription=ratios, fusion=False,
                                               policy="wfd"),
                     interference=model, learner=learner, sample_every_s=2.0)
    return sim.run().makespan_s, sim


def sp1_of(models: list[str], rates: int = 4) -> SearchSpace:
    """SP1's models named, with `rates` learning rates (SP1's 4; more: more waves)."""
    data = load_space(str(EXAMPLES / "sp1.yaml")).model_dump(mode="json", exclude_defaults=True)
    lr = {**data["hyperparameters"]["lr"], "num": rates}
    return parse_space({**data, "name": "sp1-" + models[0], "models": models,
                        "hyperparameters": {**data["hyperparameters"], "lr": lr}})


def mix_shift(sweep: list[float], h100: float) -> None:
    print("\nmix shift (hidden: transformers queue fully past half the default saturation, "
          "CNNs for a fifth): the second study's makespan")
    print(f"{'first -> second':<28}{'configured':>12}{'by workload':>13}{'one fit':>10}"
          f"{'best fixed':>17}{'by wl/best':>12}{'one/best':>10}  ratios (by workload | one)")
    for first, second in ((CNNS, TRANSFORMERS), (TRANSFORMERS, CNNS)):
        configured, _ = makespan(sp1_of(second, RATES), SHIFT, dict(DEFAULT_RATIOS))
        got = {}
        ratios = {}
        for by_workload in (True, False):
            learner = RatioLearner(DEFAULT_RATIOS, high=6.0, every=10, min_samples=20,
                                   by_workload=by_workload)
            makespan(sp1_of(first), SHIFT, dict(DEFAULT_RATIOS), learner)
            got[by_workload], _ = makespan(sp1_of(second, RATES), SHIFT,
                                           dict(learner.ratios), learner)
            ratios[by_workload] = " ".join(f"{a}={r:g}" for a, r in sorted(learner.ratios.items()))
        best, best_ratio = min((makespan(sp1_of(second, RATES), SHIFT,
                                         {"A100": a, "H100": a * h100})[0], a) for a in sweep)
        label = ("CNNs -> transformers" if first is CNNS else "transformers -> CNNs")
        print(f"{label:<28}{configured:>10.0f} s{got[True]:>11.0f} s{got[False]:>8.0f} s"
              f"{best:>9.0f} s @{best_ratio:<4g}{got[True] / best:>12.3f}"
              f"{got[False] / best:>10.3f}  {ratios[True]} | {ratios[False]}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--studies", default="sp1,sp2,sp3,sp4")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--sweep", default="1,1.5,2,2.5,3,3.5,4,5,6",
                    help="A100 ratios to sweep (H100's scaled as the defaults are)")
    ap.add_argument("--one-fit", action="store_true",
                    help="the table with one fit of every sample (no per-workload fits)")
    ap.add_argument("--mix-shift-only", action="store_true",
                    help="only the mix shift (per-workload fits against one fit)")
    args = ap.parse_args()
    h100 = DEFAULT_RATIOS["H100"] / DEFAULT_RATIOS["A100"]
    swept = [float(x) for x in args.sweep.split(",")]
    if args.mix_shift_only:
        mix_shift(swept, h100)
        return 0
    print("cold: the learner starts at the configured ratios in this study; warm: it goes "
          "on into a second run of the study with what it learned (a server keeps its "
          "learned ratios across studies)")
    print(f"{'model':<16}{'study':<7}{'configured':>12}{'cold':>9}{'warm':>9}"
          f"{'best fixed':>17}{'cold/best':>11}{'warm/best':>11}{'warm/conf':>11}"
          "  ratios after")
    for model_name in args.models.split(","):
        model = MODELS[model_name]
        for study in args.studies.split(","):
            configured, _ = makespan(study, model, dict(DEFAULT_RATIOS))
            learner = RatioLearner(DEFAULT_RATIOS, high=6.0, every=10, min_samples=20,
                                   by_workload=not args.one_fit)
            cold, _ = makespan(study, model, dict(DEFAULT_RATIOS), learner)
            warm, _ = makespan(study, model, dict(learner.ratios), learner)
            sweep = []
            for a100 in (float(x) for x in args.sweep.split(",")):
                m, _ = makespan(study, model, {"A100": a100, "H100": a100 * h100})
                sweep.append((m, a100))
            best, best_ratio = min(sweep)
            final = " ".join(f"{a}={r:g}" for a, r in sorted(learner.ratios.items()))
            print(f"{model_name:<16}{study:<7}{configured:>10.0f} s{cold:>7.0f} s"
                  f"{warm:>7.0f} s{best:>9.0f} s @{best_ratio:<4g}{cold / best:>11.3f}"
                  f"{warm / best:>11.3f}{warm / configured:>11.3f}  {final}", flush=True)
    mix_shift(swept, h100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
