#!/usr/bin/env python3
"""What a late choice costs under `predict`: each of scripts/sim_makespan.py's scenarios
run with the study's rule chosen before its first decision (as the simulator does), and
again with its first decision placed by predict's fallback (`eft`) and the rest by the
choice, as a server would if it did not wait for the choice. The ratio of the two
makespans per scenario, and the mean, worst and count past 1 %. This is why the server
holds a study's trials for its choice (orchestrator/foresight.py, HOLD_SHARE).

    python scripts/sim_late_choice.py               # 24 scenarios (seeds 0-1)
    python scripts/sim_late_choice.py --seeds 6
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import sim_makespan as sm

from hypersack.orchestrator import foresight


@contextmanager
def first_decision_by_fallback() -> Iterator[None]:
    """RuleChooser.rule answers the fallback at each study's first decision (every
    ask at that virtual time: several decisions, and the learner, may ask then)."""
    chooser = foresight.RuleChooser
    original = chooser.rule

    def late(self: foresight.RuleChooser, study_id: str, space: object,
             ask: foresight.Ask) -> str:
        # The first decision: every ask at the (virtual) time of the study's first.
        first: dict[str, float] = self.__dict__.setdefault("_late_first", {})
        now = self.s.clock.now()
        if first.setdefault(study_id, now) == now:
            return ask.fallback
        return original(self, study_id, space, ask)  # type: ignore[arg-type]

    chooser.rule = late  # type: ignore[assignment,method-assign]
    try:
        yield
    finally:
        chooser.rule = original  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    if args.seeds < 1:
        ap.error("--seeds must be at least 1")
    ratios = []
    for cluster in sm.CLUSTERS:
        for kind in sm.KINDS:
            for fusion in (False, True):
                for seed in range(args.seeds):
                    first = sm.makespans(cluster, kind, fusion, seed, ("predict",))["predict"]
                    with first_decision_by_fallback():
                        late = sm.makespans(cluster, kind, fusion, seed,
                                            ("predict",))["predict"]
                    ratios.append(late / first)
                    print(f"{cluster:8} {kind:8} fusion {'on ' if fusion else 'off'} "
                          f"seed {seed}: chosen first {first:7.0f} s, first wave by eft "
                          f"{late:7.0f} s, ratio {late / first:.3f}", flush=True)
    print(f"late / chosen first: mean {statistics.mean(ratios):.4f}, worst "
          f"{max(ratios):.4f}; more than 1 % later in {sum(r > 1.01 for r in ratios)} "
          f"of {len(ratios)}")


if __name__ == "__main__":
    main()
