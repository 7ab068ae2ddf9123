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
    python scripts/sim_learned_ratio.py --seeds 4 --no-mix-shift   # perturbed profiles too
    python scripts/sim_learned_ratio.py --models held-out --studies sp1,sp2,sp3 --seeds 2 \
        --no-mix-shift   # six interference models the learner was never tuned on

Then the mix shift: per-workload fits against one fit of every sample. A hidden model
where the transformers' kernels queue fully past half the default saturation and the
CNNs' for a fifth of an iteration; SP1's CNNs as one study, then its transformers as the
next (and the other way round), the learner going on from the first into the second:
the second study's makespan with each, the configured ratios and the best fixed ratio.
"""

from __future__ import annotations

import argparse
import random
import sys

from _instances import EXAMPLES

from hypersack.core.bounds import MAX_RATIO
from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import Profile
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
# Models the learner was never tuned on (`--models held-out`, or any of their names): a
# check that it learns the class of interference, not the four points above.
HELD_OUT = {
    "sat-1.5x": Interference(saturation_pct={a: 1.5 * s for a, s in BASE.saturation_pct.items()}),
    "sat-0.7x": Interference(saturation_pct={a: 0.7 * s for a, s in BASE.saturation_pct.items()}),
    "contention-0.2": Interference(contention=0.2),
    "contention-0.4": Interference(contention=0.4),
    "cnns-half-queued": Interference(queued={m: 0.5 for m in
                                             ["shufflenet", "mobilenet_v2", "resnet18",
                                              "resnet34"]}),
    "sat-half-contention-0.1": Interference(
        saturation_pct={a: s / 2 for a, s in BASE.saturation_pct.items()}, contention=0.1),
}
CLUSTER = "1x4xA100-80GB@88,1x2xH100-80GB@96"  # the paper's
TRUTH = load_profiles(EXAMPLES / "profiles-estimates.yaml")  # read once, for every run


def perturbed(seed: int) -> list[Profile]:
    """The example estimates (seed 0), or each workload's iteration time and compute share
    drawn around them (x0.8-1.25 and x0.8-1.2; one draw across architectures)."""
    if seed == 0:
        return TRUTH
    rng = random.Random(f"learned-{seed}")
    draws: dict[tuple[str, int], tuple[float, float]] = {}
    out = []
    for p in TRUTH:
        time_x, compute_x = draws.setdefault((p.key.model, p.key.batch_size),
                                             (rng.uniform(0.8, 1.25), rng.uniform(0.8, 1.2)))
        demand = p.demand.model_copy(update={
            "compute_pct": min(100.0, p.demand.compute_pct * compute_x)})
        out.append(p.model_copy(update={"demand": demand,
                                        "iter_time_s": p.iter_time_s * time_x}))
    return out


STUDIES = ("sp1", "sp2", "sp3", "sp4")
CNNS = ["shufflenet", "mobilenet_v2", "resnet18", "resnet34"]
TRANSFORMERS = ["vit_tiny", "deit_tiny"]
RATES = 16  # the second study's learning rates: 4 x SP1's trials, several waves
SHIFT = Interference(saturation_pct={a: s / 2 for a, s in BASE.saturation_pct.items()},
                     queued={m: 0.2 for m in CNNS})


FORESIGHT = [True]  # --no-foresight: the learner's target from its progress model alone
# The learner here decides every 10 samples (GPUs sampled every 2 s of virtual time, a
# decision every few seconds); it simulates again every this many decisions.
FORESIGHT_EVERY = 10


def makespan(space_name: str | SearchSpace, model: Interference, ratios: dict[str, float],
             learner: RatioLearner | None = None, truth: list[Profile] | None = None
             ) -> tuple[float, Simulation]:
    """One run; a learner samples each GPU every 2 s of virtual time (a trial reports
    its iteration time each epoch; the studies here last minutes). With foresight, the
    learner simulates the study under candidate ratios with its fits."""
    space = load_space(str(EXAMPLES / f"{space_name}.yaml")) \
        if isinstance(space_name, str) else space_name
    sim = Simulation(space, parse_shorthand(CLUSTER), TRUTH if truth is None else truth,
                     config=OrchestratorConfig(oversubscription=ratios, fusion=False,
                                               policy="wfd", learn_foresight=FORESIGHT[0]),
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
                                   by_workload=by_workload, foresight_every=FORESIGHT_EVERY)
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
    ap.add_argument("--models", default=",".join(MODELS),
                    help="hidden interference models, comma-separated: "
                         f"{', '.join(MODELS)} (the default), or the held-out "
                         f"{', '.join(HELD_OUT)} ('held-out': all of those)")
    ap.add_argument("--sweep", default="1,1.5,2,2.5,3,3.5,4,5,6",
                    help="A100 ratios to sweep (H100's scaled as the defaults are)")
    ap.add_argument("--one-fit", action="store_true",
                    help="the table with one fit of every sample (no per-workload fits)")
    ap.add_argument("--mix-shift-only", action="store_true",
                    help="only the mix shift (per-workload fits against one fit)")
    ap.add_argument("--seeds", type=int, default=1,
                    help="profiles per cell: seed 0 the example estimates, each further "
                         "seed their iteration times and compute shares drawn around them")
    ap.add_argument("--seed", type=int, default=None, help="only this seed")
    ap.add_argument("--no-mix-shift", action="store_true", help="leave out the mix shift")
    ap.add_argument("--no-foresight", action="store_true",
                    help="the learner's target from its progress model alone, without "
                         "simulating the study under candidate ratios")
    args = ap.parse_args()
    FORESIGHT[0] = not args.no_foresight
    if args.seeds < 1 or (args.seed is not None and args.seed < 0):
        ap.error("--seeds must be at least 1 and --seed at least 0")
    names = args.models.replace("held-out", ",".join(HELD_OUT)).split(",")
    unknown = [m for m in names if m not in MODELS and m not in HELD_OUT]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: "
                 f"{', '.join([*MODELS, *HELD_OUT, 'held-out'])}")
    studies = args.studies.split(",")
    missing = [st for st in studies if st not in STUDIES]
    if missing:
        ap.error(f"unknown stud(ies) {', '.join(missing)}; known: {', '.join(STUDIES)}")
    h100 = DEFAULT_RATIOS["H100"] / DEFAULT_RATIOS["A100"]
    try:
        swept = [float(x) for x in args.sweep.split(",")]
    except ValueError:
        swept = []
    if not swept or len(swept) > 100 or not all(0 < x <= MAX_RATIO for x in swept):
        ap.error(f"--sweep: up to 100 A100 ratios in (0, {MAX_RATIO:g}], comma-separated "
                 f"(got {args.sweep[:80]!r})")
    if args.mix_shift_only:
        mix_shift(swept, h100)
        return 0
    print("cold: the learner starts at the configured ratios in this study; warm: it goes "
          "on into a second run of the study with what it learned (a server keeps its "
          "learned ratios across studies)")
    seeds = range(args.seeds) if args.seed is None else [args.seed]
    print(f"{'model':<16}{'study':<7}{'seed':>5}{'configured':>12}{'cold':>9}{'warm':>9}"
          f"{'best fixed':>17}{'cold/best':>11}{'warm/best':>11}{'warm/conf':>11}"
          "  ratios after")
    cells = []
    for model_name in names:
        model = MODELS.get(model_name) or HELD_OUT[model_name]
        for study in studies:
            for seed in seeds:
                truth = perturbed(seed)
                configured, _ = makespan(study, model, dict(DEFAULT_RATIOS), truth=truth)
                learner = RatioLearner(DEFAULT_RATIOS, high=6.0, every=10, min_samples=20,
                                       by_workload=not args.one_fit,
                                       foresight_every=FORESIGHT_EVERY)
                cold, _ = makespan(study, model, dict(DEFAULT_RATIOS), learner, truth)
                warm, _ = makespan(study, model, dict(learner.ratios), learner, truth)
                sweep = []
                for a100 in swept:
                    m, _ = makespan(study, model, {"A100": a100, "H100": a100 * h100},
                                    truth=truth)
                    sweep.append((m, a100))
                best, best_ratio = min(sweep)
                cells.append((warm / best, warm / configured))
                final = " ".join(f"{a}={r:g}" for a, r in sorted(learner.ratios.items()))
                print(f"{model_name:<16}{study:<7}{seed:>5}{configured:>10.0f} s{cold:>7.0f} s"
                      f"{warm:>7.0f} s{best:>9.0f} s @{best_ratio:<4g}{cold / best:>11.3f}"
                      f"{warm / best:>11.3f}{warm / configured:>11.3f}  {final}", flush=True)
    n = len(cells)
    print(f"warm, over {n} runs: within 5 % of the best fixed ratio in "
          f"{sum(b <= 1.05 for b, _ in cells)}, no more than 2 % over the configured in "
          f"{sum(c <= 1.02 for _, c in cells)}; mean warm/best "
          f"{sum(b for b, _ in cells) / n:.3f} (worst {max(b for b, _ in cells):.3f}), mean "
          f"warm/configured {sum(c for _, c in cells) / n:.3f} "
          f"(worst {max(c for _, c in cells):.3f})", flush=True)
    if args.no_mix_shift:
        return 0
    mix_shift(swept, h100)
    return 0


if __name__ == "__main__":
    sys.exit(main())
