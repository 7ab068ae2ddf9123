"""The learned sharing level on real interference (issue 38, item 3): this machine's CPU
cores are what trials share.

An embedded server and a local agent (one process, as `hypersack run`) with a fake
inventory of one A100 and 48 declared cores, so that only the A100's oversubscription
ratio bounds how many trials run at once; the trials are the built-in `sleep` workload
with `busy_fraction`: each iteration computes for that share of its time (counted in CPU
time) and sleeps the rest, so past what the real cores hold, trials slow each other
down for real. Each workload is profiled alone first (its solo iteration time and
compute share: about `busy_fraction` x 100 %).

First a sweep of fixed ratios (learning off), then learned runs starting from ratios far
off (too low and too high). Each run is a fresh database and lasts `--seconds`. A
learned run prints the ratio in force over time. Throughput is epochs trained per
minute after `--warmup` seconds, in trials' worth (trials that start together end
together, so counting completions would count bursts).

    python scripts/cpu_learned_ratio.py                 # the whole table (~20 min)
    python scripts/cpu_learned_ratio.py --sweep 2 --learn  # one fixed ratio, no learning
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypersack.agent.agent import Agent
from hypersack.agent.devices import DeviceBackend, FakeBackend
from hypersack.agent.guard import CommandPolicy
from hypersack.agent.mps import MpsControl
from hypersack.cli.client import Client
from hypersack.server.app import HyperSackServer
from hypersack.wire.settings import ServerSettings

SPACE = """\
name: cpu-share
models: [resnet18]
hyperparameters:
  batch_size: [64]
  lr: {lrs}
settings:
  epochs: {epochs}
  fusion: "off"
  retries: 0
program:
  builtin: sleep
  options: {{seconds_per_epoch: {epoch_s}, iters_per_epoch: 10, busy_fraction: {busy}}}
"""


def done_epochs(server: HyperSackServer, study: str) -> float:
    """Epochs the study's trials have reported (each trial's latest)."""
    with server.service.locked():
        return float(sum(h.step for h in server.service.orch.last_steps(study).values()))


def serve_agent(server: HyperSackServer, agent: Agent) -> threading.Thread:
    """Run the agent (named `local`) on a thread until it has registered with the server
    (at most 60 s): the thread."""
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60.0
    while not ((s := server.service.sessions().get("local")) and s.connected):
        if time.monotonic() > deadline or not thread.is_alive():
            raise SystemExit("the local agent did not register in 60 s")
        time.sleep(0.05)
    return thread


def one_run(ratio: float, learn: bool, seconds: float, args: argparse.Namespace, *,
            backend: DeviceBackend | None = None, arch: str = "A100",
            space: str | None = None, mps: Callable[[Path], MpsControl] | None = None,
            watch: Callable[[Agent], None] | None = None) -> dict[str, Any]:
    """One run of `seconds`: the sleep study on a fake A100 by default, or `space` on
    `backend`'s devices (scripts/gpu_learned_ratio.py: a real GPU, with `mps`)."""
    with tempfile.TemporaryDirectory(prefix="hs-learn-") as tmp:
        state = Path(tmp)
        settings = ServerSettings(
            listen="127.0.0.1:0", db=state / "run.db", oversubscription={arch: ratio},
            heartbeat_interval_s=1.0, heartbeat_timeout_s=60.0, tick_interval_s=0.5,
            learn_ratio=learn, learn_ratio_max=args.max_ratio,
            learn_sample_every_s=args.sample_every_s,
            learn_decide_every_s=args.decide_every_s, learn_min_samples=args.min_samples,
            learn_settle_s=args.settle_s)
        server = HyperSackServer(settings)
        server.start()
        backend = backend or FakeBackend("1xA100-80GB@48", node="local")
        agent = Agent(server.address, "local", backend,
                      state / "work", poll_interval_s=0.1,
                      commands=CommandPolicy.permissive(), inherit_env=True,
                      mps=mps(state / "mps") if mps else None)
        if watch is not None:
            watch(agent)
        thread = serve_agent(server, agent)
        try:
            if space is None:
                lrs = [round(1e-4 * (i + 1), 6) for i in range(args.trials)]
                space = SPACE.format(lrs=json.dumps(lrs), epochs=args.epochs,
                                     epoch_s=args.epoch_s, busy=args.busy)
            with Client(server.address) as client:
                study = client.submit(space, "share.yaml").id
                start = time.monotonic()
                timeline: list[tuple[float, float, int, float]] = []
                at_warmup = None
                while (elapsed := time.monotonic() - start) < seconds:
                    counts = client.study(study).counts
                    with server.service.locked():
                        in_force = server.service.orch.s.config.ratio(arch, {})
                    epochs = done_epochs(server, study)
                    timeline.append((elapsed, epochs, counts.get("RUNNING", 0), in_force))
                    if at_warmup is None and elapsed >= args.warmup:
                        at_warmup = (elapsed, epochs)
                    time.sleep(2.0)
                end = (time.monotonic() - start, done_epochs(server, study))
                levels = list(client.cluster().sharing)
                demands = [(p.demand.compute_pct, p.demand.memory_mib, p.demand.cores)
                           for p in server.service.profiles()]
                client.cancel(study)
        finally:
            logging.getLogger("hypersack.server.service").setLevel(logging.ERROR)
            agent.stop()
            thread.join(timeout=15)
            server.stop()
    assert at_warmup is not None
    # Trials that start together end together: completions come in bursts, so the
    # throughput is the epochs trained (those of running trials too) per minute, in
    # trials' worth (a trial is `epochs` epochs).
    per_min = (end[1] - at_warmup[1]) / args.epochs / ((end[0] - at_warmup[0]) / 60.0)
    running = [r for t, _, r, _ in timeline if t >= args.warmup]
    level = next((lv for lv in levels if lv.arch == arch), None)
    return {"start": ratio, "learn": learn, "per_min": per_min,
            "mean_running": sum(running) / max(1, len(running)),
            "final_ratio": timeline[-1][3], "timeline": timeline,
            "samples": level.samples if level else 0,
            "demands": demands,
            "fit": (level.contention, level.saturation_pct, level.queued) if level else None}


def parser(doc: str) -> argparse.ArgumentParser:
    """The runs' settings (scripts/gpu_learned_ratio.py takes the same)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--sweep", type=float, nargs="*", default=[1.0, 1.5, 2.0, 2.5, 3.0, 4.0])
    p.add_argument("--learn", type=float, nargs="*", default=[1.0, 4.0],
                   help="starting ratios of the learned runs")
    p.add_argument("--seconds", type=float, default=120.0, help="per fixed-ratio run")
    p.add_argument("--learn-seconds", type=float, default=240.0, help="per learned run")
    p.add_argument("--warmup", type=float, default=30.0)
    p.add_argument("--trials", type=int, default=2000)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--epoch-s", type=float, default=1.0)
    p.add_argument("--busy", type=float, default=0.4)
    p.add_argument("--max-ratio", type=float, default=6.0)
    p.add_argument("--sample-every-s", type=float, default=1.0)
    p.add_argument("--decide-every-s", type=float, default=3.0)
    p.add_argument("--min-samples", type=int, default=10)
    p.add_argument("--settle-s", type=float, default=3.0,
                   help="no sample from the GPU this long after a trial came or went")
    return p


def main() -> None:
    args = parser(__doc__).parse_args()
    logging.basicConfig(level=logging.WARNING)
    print(f"{os.cpu_count()} CPUs; trials: {args.epochs} epochs of {args.epoch_s:g} s solo, "
          f"{100 * args.busy:.0f} % computing; one fake A100 (48 declared cores)", flush=True)
    rows = []
    for r in args.sweep:
        row = one_run(r, False, args.seconds, args)
        rows.append(row)
        print(f"fixed {r:g}: {row['per_min']:.1f} trials/min, {row['mean_running']:.1f} "
              f"running on average", flush=True)
    best = max(rows, key=lambda x: x["per_min"]) if rows else None
    for r in args.learn:
        row = one_run(r, True, args.learn_seconds, args)
        rows.append(row)
        path = " ".join(f"{t:.0f}s:{q:g}" for t, _, _, q in row["timeline"][::10])
        print(f"learned from {r:g}: {row['per_min']:.1f} trials/min after "
              f"{args.warmup:g} s, final ratio {row['final_ratio']:g} "
              f"({row['samples']} samples, fit (c, S, a) {row['fit']}); ratio over time: "
              f"{path}",
              flush=True)
    if best is not None:
        print(f"\nbest fixed ratio {best['start']:g}: {best['per_min']:.1f} trials/min")
        for row in rows:
            if row["learn"]:
                print(f"learned from {row['start']:g}: {row['per_min'] / best['per_min']:.2f}"
                      " of the best fixed ratio's throughput")


if __name__ == "__main__":
    main()
