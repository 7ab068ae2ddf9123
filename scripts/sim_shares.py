#!/usr/bin/env python3
"""Several studies on one cluster, in the simulator (the real orchestrator, virtual time).

1. Fair share: alice submits SP1 (longer epochs) at 0 s, bob the same search at 600 s.
   Prints each one's share of the scaled compute over time and writes an SVG of it.
2. Priority: a background SP1 runs; at 600 s a small urgent study arrives with a higher
   priority, without and with `preempt: true`. Prints the urgent study's wait (first
   launch - submission) and its end, and what preemption cost the background study.

Shares count GPU-equivalents of scaled compute (the README's rule); the cluster is the
paper's (4 x A100-80GB + 2 x H100-80GB), profiles the example estimates.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from _instances import EXAMPLES

from hypersack.core.cluster import load_cluster
from hypersack.grid.space import load_space, parse_space
from hypersack.orchestrator import OrchestratorConfig
from hypersack.sampler.profiles import load_profiles
from hypersack.sim.gantt import shares_svg
from hypersack.sim.results import SimResult, time_mean
from hypersack.sim.simulator import Simulation


def variant(name: str, epochs: float, models: list[str] | None = None,
            batch_sizes: list[int] | None = None, **settings: Any) -> Any:
    data = load_space(str(EXAMPLES / "sp1.yaml")).model_dump(mode="json",
                                                              exclude_defaults=True)
    data["name"] = name
    data["settings"] = {**data.get("settings", {}), "epochs": epochs, **settings}
    if models:
        data["models"] = models
    if batch_sizes:
        data["hyperparameters"]["batch_size"] = batch_sizes
    return parse_space(data)


def run(first: Any, more: list[tuple[float, Any, str]]) -> SimResult:
    cluster = load_cluster(str(EXAMPLES / "cluster-paper.yaml"))
    truth = load_profiles(EXAMPLES / "profiles-estimates.yaml")
    return Simulation(first, cluster, truth, config=OrchestratorConfig(fusion=False),
                      more=more).run()


def share_at(series: list[tuple[float, float]], t: float) -> float:
    value = 0.0
    for at, share in series:
        if at > t:
            break
        value = share
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=float, default=15.0)
    parser.add_argument("--svg", type=Path, default=Path("shares.svg"))
    args = parser.parse_args()

    # 1. Two users, ten minutes apart.
    alice = variant("alice-sp1", args.epochs)
    bob = variant("bob-sp1", args.epochs)
    r = run(alice, [(600.0, bob, "bob")])
    a, b = sorted(r.shares)
    print(f"fair share: alice at 0 s, bob at 600 s; both end by {r.makespan_s:.0f} s")
    print(f"{'time s':>8}{'alice':>8}{'bob':>8}")
    step = max(60.0, round(r.makespan_s / 20 / 60) * 60)
    t = 0.0
    while t <= r.makespan_s:
        print(f"{t:8.0f}{share_at(r.shares[a], t):8.1%}{share_at(r.shares[b], t):8.1%}")
        t += step
    # From when bob's share first reaches 45 % while both still have trials waiting.
    reached = next((at for at, s in r.shares[b] if s >= 0.45), None)
    both_wait = min(r.last_launch_s.values())
    if reached is not None:
        print(f"bob reaches 45 % at {reached:.0f} s ({reached - 600:.0f} s after submitting);"
              f" mean shares from then until {both_wait:.0f} s (the last launch of the "
              f"first to run out of waiting trials): alice "
              f"{time_mean(r.shares[a], reached, both_wait):.1%}, bob "
              f"{time_mean(r.shares[b], reached, both_wait):.1%}")
    print(f"alice ends at {r.ended_s[a]:.0f} s, bob at {r.ended_s[b]:.0f} s")
    args.svg.write_text(shares_svg(
        r.shares, r.makespan_s, title="Two users' SP1 studies, 600 s apart: share of the "
        "cluster's scaled compute", labels={a: "alice (submitted at 0 s)",
                                            b: "bob (submitted at 600 s)"},
        marks=[(0.0, "alice"), (600.0, "bob")]))
    print(f"wrote {args.svg}")

    # 2. An urgent study beside a background one.
    print("\npriority: background SP1 at 0 s; urgent study (8 trials) at 600 s")
    print(f"{'urgent':<22}{'wait s':>8}{'ends s':>9}{'background ends s':>19}"
          f"{'trials stopped':>16}")
    alone = run(variant("background", args.epochs), [])
    print(f"{'(background alone)':<22}{'':>8}{'':>9}{alone.makespan_s:19.0f}{0:16d}")
    for label, settings in (("same priority", {}), ("priority 5", {"priority": 5}),
                            ("priority 5, preempt", {"priority": 5, "preempt": True})):
        urgent = variant("urgent", 2.0, ["resnet18"], [64, 128], **settings)
        r = run(variant("background", args.epochs), [(600.0, urgent, "")])
        sid = next(s for s in r.submitted_s if s.startswith("urgent"))
        bg = next(s for s in r.submitted_s if s.startswith("background"))
        wait = r.first_launch_s.get(sid, float("nan")) - r.submitted_s[sid]
        stopped = sum(1 for seg in r.timeline if seg.outcome == "KILLED")
        print(f"{label:<22}{wait:8.0f}{r.ended_s[sid]:9.0f}{r.ended_s[bg]:19.0f}"
              f"{stopped:16d}")


if __name__ == "__main__":
    main()
