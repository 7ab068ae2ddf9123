#!/usr/bin/env python3
"""What one event costs the orchestrator itself, without gRPC: the server-side part of
the exit-to-next-launch delay.

A cluster of N nodes x 4 A100-80GB (88 cores; `--gpus`), studies of random SP1 trials (example
estimated profiles, ratio 3), an in-memory store. Each step ends one running trial (the
one started first) and times `handle(TrialFinished)`, which decides again; then a Tick
that changes nothing is timed. Reported: p50/p99 per event in ms, the decisions taken,
and each figure against the cost of the same event with one study of 1,000 trials,
measured in the same run.

    python scripts/bench_decisions.py                        # 200 nodes, 10,000 trials
    python scripts/bench_decisions.py --studies 4 --profile  # with cProfile's top 15

`--tail`: a study's tail instead, every trial placed and nothing pending (the thousand-
node run's last 50 seconds): batches of `--batch` exits and one node's heartbeat, as
the server applies them under load, with the SQLite store the server uses; reported in
ms of CPU per exit (process time), against 20 nodes in the same run.

    python scripts/bench_decisions.py --tail --nodes 1000 --gpus 8 --models resnet18 \
        --batch-sizes 128 --exits 20000
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import tempfile
import time
from pathlib import Path

from _instances import EXAMPLES

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.types import TrialState
from hypersack.grid.space import parse_space
from hypersack.orchestrator import (
    Heartbeat,
    LaunchGroup,
    LaunchTrial,
    NodeJoined,
    Orchestrator,
    OrchestratorConfig,
    StudySubmitted,
    Tick,
    TrialFinished,
)
from hypersack.orchestrator.events import RunningTrial
from hypersack.sampler.profiles import load_profiles
from hypersack.server.service import keep_out_of_gc
from hypersack.store.memory import MemoryStore
from hypersack.store.sqlite import SqliteStore

MODELS = ["shufflenet", "mobilenet_v2", "vit_tiny", "deit_tiny", "resnet18", "resnet34"]


def space(name: str, trials: int, seed: int, policy: str = "wfd",
          models: list[str] | None = None, batch_sizes: list[int] | None = None) -> object:
    return parse_space({
        "name": name, "models": models or MODELS,
        "hyperparameters": {"batch_size": batch_sizes or [64, 128, 256, 512],
                            "lr": {"distribution": "loguniform", "low": 1e-5, "high": 0.1}},
        "search": {"type": "random", "samples": trials, "seed": seed},
        "settings": {"epochs": 1, "policy": policy, "fusion": "off"},
        "program": {"builtin": "sleep"},
    })


def run(nodes: int, trials: int, studies: int, exits: int, profile: bool,
        policy: str = "wfd", gpus: int = 4, models: list[str] | None = None,
        batch_sizes: list[int] | None = None) -> dict[str, float]:
    store = MemoryStore()
    for p in load_profiles(EXAMPLES / "profiles-estimates.yaml"):
        store.put_profile(p)
    clock = ManualClock(0.0)
    orch = Orchestrator(store, clock, OrchestratorConfig())
    for node in parse_shorthand(f"{nodes}x{gpus}xA100-80GB@{22 * gpus}").nodes:
        orch.handle(NodeJoined(node))
    started: dict[str, tuple[float, str, int]] = {}

    def note(cmds: list[object]) -> None:
        for c in cmds:
            launches = c.members if isinstance(c, LaunchGroup) else (c,)
            for m in launches:
                if isinstance(m, LaunchTrial):
                    started[m.trial_id] = (clock.now(), m.node, m.attempt)

    for i in range(studies):
        study = space(f"s{i}", trials // studies, i, policy, models, batch_sizes)
        note(orch.handle(StudySubmitted(study, owner=f"u{i}")))
    keep_out_of_gc()  # as the server does after a submission
    exit_ms: list[float] = []
    tick_ms: list[float] = []
    decisions = orch.decision_count
    profiler = cProfile.Profile() if profile else None
    for _ in range(exits):
        if not started:
            break
        tid = min(started, key=lambda t: (started[t][0], t))
        _, node, attempt = started.pop(tid)
        clock.advance(0.01)
        if profiler:
            profiler.enable()
        t0 = time.perf_counter()
        cmds = orch.handle(TrialFinished(tid, node, metrics={"loss": 1.0}, attempt=attempt))
        exit_ms.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        note(cmds + orch.handle(Tick()))
        tick_ms.append((time.perf_counter() - t0) * 1000)
        if profiler:
            profiler.disable()
    pending = sum(t.state == TrialState.PENDING for t in orch.trials())
    if profiler:
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)
    return {"exit_p50": statistics.median(exit_ms),
            "exit_p99": statistics.quantiles(exit_ms, n=100)[98],
            "tick_p50": statistics.median(tick_ms),
            "tick_p99": statistics.quantiles(tick_ms, n=100)[98],
            "decisions": orch.decision_count - decisions, "pending": pending}


def _cluster(store: object, clock: ManualClock, nodes: int, gpus: int) -> Orchestrator:
    for p in load_profiles(EXAMPLES / "profiles-estimates.yaml"):
        store.put_profile(p)  # type: ignore[attr-defined]
    orch = Orchestrator(store, clock, OrchestratorConfig())  # type: ignore[arg-type]
    for spec in parse_shorthand(f"{nodes}x{gpus}xA100-80GB@{22 * gpus}").nodes:
        orch.handle(NodeJoined(spec))
    return orch


def tail(nodes: int, gpus: int, exits: int, batch: int, models: list[str] | None,
         batch_sizes: list[int] | None, profile: bool = False) -> float:
    """CPU ms per exit with nothing pending (see the module's doc)."""
    clock = ManualClock(0.0)
    # How many trials the cluster holds at once: what the first decision places of many.
    probe = _cluster(MemoryStore(), clock, nodes, gpus).handle(StudySubmitted(
        space("probe", min(100_000, 20 * nodes * gpus), 0, "wfd", models, batch_sizes)))
    fit = sum(isinstance(c, LaunchTrial) for c in probe)
    with tempfile.TemporaryDirectory(prefix="hs-tail-") as tmp:
        # The first `fit` of another draw's trials may not all fit (another mix): fewer,
        # on a fresh cluster, until every trial is placed and nothing is pending.
        while True:
            store = SqliteStore(Path(tmp) / f"tail-{fit}.db")
            orch = _cluster(store, clock, nodes, gpus)
            running: dict[str, dict[str, tuple[int, int]]] = {}
            for c in orch.handle(StudySubmitted(space("tail", fit, 0, "wfd", models,
                                                      batch_sizes))):
                if isinstance(c, LaunchTrial):
                    running.setdefault(c.node, {})[c.trial_id] = (c.gpu_index, c.attempt)
            placed = sum(len(ts) for ts in running.values())
            if placed == fit:
                break
            store.close()
            fit = placed
        keep_out_of_gc()
        order = [(n, t) for n, ts in running.items() for t in ts]
        random.Random(0).shuffle(order)
        names = sorted(running)
        exits = min(exits, len(order) - len(order) % batch)
        profiler = cProfile.Profile() if profile else None
        if profiler:
            profiler.enable()
        began = time.process_time()
        for k in range(0, exits, batch):
            events: list[object] = []
            for name, tid in order[k:k + batch]:
                _, attempt = running[name].pop(tid)
                events.append(TrialFinished(tid, name, metrics={"loss": 1.0}, attempt=attempt))
            beat = names[(k // batch) % len(names)]
            events.append(Heartbeat(beat, tuple(RunningTrial(t, g, 0, 0.0, a)
                                                for t, (g, a) in running[beat].items())))
            clock.advance(0.004)
            orch.handle_batch(events)  # type: ignore[arg-type]
        spent = time.process_time() - began
        if profiler:
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
        store.close()
    return 1000 * spent / max(1, exits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--trials", type=int, default=10_000)
    parser.add_argument("--studies", type=int, default=1)
    parser.add_argument("--exits", type=int, default=400)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--tail", action="store_true",
                        help="nothing pending: CPU per exit in batches (see above)")
    parser.add_argument("--batch", type=int, default=3, help="exits per batch (--tail)")
    parser.add_argument("--policy", default="wfd",
                        help="the studies' policy (default wfd, as measured before; the "
                             "server's default is eft)")
    parser.add_argument("--gpus", type=int, default=4, help="GPUs per node (22 cores each)")
    parser.add_argument("--models", default="",
                        help="comma-separated (default: six of the paper's; "
                             "bench_control_plane.py's study is resnet18 at batch 128)")
    parser.add_argument("--batch-sizes", default="", help="comma-separated (default 64-512)")
    args = parser.parse_args()
    models = args.models.split(",") if args.models else None
    sizes = [int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes else None
    if args.tail:
        small = tail(20, args.gpus, args.exits, args.batch, models, sizes)
        large = tail(args.nodes, args.gpus, args.exits, args.batch, models, sizes,
                     args.profile)
        print(f"nothing pending, {args.batch} exits and a heartbeat per batch, SQLite: "
              f"20 nodes {small:.3f} ms of CPU per exit, {args.nodes} nodes {large:.3f} "
              f"({large / small:.2f}x)")
        return
    base = run(20, 1_000, 1, args.exits, False, args.policy, args.gpus, models, sizes)
    big = run(args.nodes, args.trials, args.studies, args.exits, args.profile, args.policy,
              args.gpus, models, sizes)
    print(f"{'':28}{'exit p50':>10}{'exit p99':>10}{'tick p50':>10}{'tick p99':>10}"
          f"{'decisions':>11}{'pending':>9}")
    for label, r in (("20 nodes, 1,000 trials", base),
                     (f"{args.nodes} nodes, {args.trials:,} trials x{args.studies}", big)):
        print(f"{label:28}{r['exit_p50']:10.2f}{r['exit_p99']:10.2f}{r['tick_p50']:10.2f}"
              f"{r['tick_p99']:10.2f}{r['decisions']:11.0f}{r['pending']:9.0f}")
    print(f"ratio to the small case (p50): exit {big['exit_p50'] / base['exit_p50']:.1f}x, "
          f"tick {big['tick_p50'] / base['tick_p50']:.1f}x   (ms per event)")


if __name__ == "__main__":
    main()
