#!/usr/bin/env python3
"""Write examples/profiles-estimates.yaml: ESTIMATED demands of the paper's nine models.

These are not measurements. They follow the HyperSack paper's figure 1 (NVML utilization
on one A100 from 22 % for ShuffleNet to 50 % for Pythia-31M, growing with batch size) and
rules of thumb for memory and iteration time; H100 runs the same work faster at lower
utilization. Real profiles from the Sampler replace them in the history.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypersack.core.catalog import MODELS
from hypersack.core.types import Demand, Profile, WorkloadKey
from hypersack.sampler.profiles import dump_profiles
from hypersack.sim.fused import with_fused

# model: (util % at the reference batch on A100, memory MiB at it, MiB per extra sample,
#         seconds per iteration at it, data-loading share, cores)
BASE = {
    "shufflenet": (22, 900, 5, 0.030, 0.45, 2),
    "mobilenet_v2": (26, 1100, 7, 0.032, 0.40, 2),
    "vit_tiny": (35, 1300, 6, 0.028, 0.30, 2),
    "deit_tiny": (36, 1350, 6, 0.029, 0.30, 2),
    "resnet18": (40, 1500, 8, 0.025, 0.30, 2),
    "resnet34": (45, 1900, 12, 0.040, 0.25, 2),
    "bert_tiny": (25, 1000, 10, 0.012, 0.20, 1),
    "pythia_14m": (42, 1600, 25, 0.030, 0.15, 1),
    "pythia_31m": (50, 2400, 40, 0.045, 0.10, 1),
}
BATCHES = {"cifar10": (64, [64, 128, 256, 512]), "imdb": (32, [8, 16, 32, 64])}
ARCH = {"A100": (1.0, 1.0), "H100": (0.8, 0.6)}  # (utilization factor, time factor)


def profiles() -> list[Profile]:
    out = []
    for model, (util, mem, per_sample, iter_s, data, cores) in BASE.items():
        info = MODELS[model]
        ref, batches = BATCHES[info.dataset]
        for arch, (uf, tf) in ARCH.items():
            for b in batches:
                scale = b / ref
                out.append(Profile(
                    key=WorkloadKey(model=model, batch_size=b),
                    arch=arch,
                    demand=Demand(compute_pct=round(min(90.0, util * uf * scale ** 0.3), 1),
                                  memory_mib=int(mem + per_sample * (b - ref)),
                                  cores=cores),
                    iter_time_s=round(iter_s * tf * scale ** 0.7, 5),
                    iters_per_epoch=math.ceil(info.samples_per_epoch / b),
                    data_fraction=data,
                    source="estimate",
                ))
    return out


def main() -> None:
    target = Path(__file__).resolve().parents[1] / "examples" / "profiles-estimates.yaml"
    header = (
        "# ESTIMATES, not measurements: written by scripts/make_example_profiles.py from the\n"
        "# HyperSack paper's figure 1 (22 % ShuffleNet .. 50 % Pythia-31M NVML utilization on\n"
        "# A100) and rules of thumb. The Sampler's real profiles replace them in the history.\n"
    )
    header += ("# Fused widths 2, 4 and 8 (fusion_width) are estimated from each workload\n"
               "# alone by hypersack/sim/fused.py (HFTA's shape: shared idle gaps, memory\n"
               "# a + b*K).\n")
    target.write_text(header + dump_profiles(with_fused(profiles())))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
