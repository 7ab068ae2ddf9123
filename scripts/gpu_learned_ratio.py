"""The learned sharing level on a real GPU with MPS (issue 38, item 7), and the relaunch
delay of a real agent (issue 37, item 5).

As scripts/cpu_learned_ratio.py, but the devices are this machine's GPUs (NVML) and the
agent runs an MPS daemon per GPU; the trials are the built-in trainer's ResNet-18 on
synthetic CIFAR-shaped data (small batches: a GPU that one such trial leaves mostly
idle, the case oversubscription is for). Each run is a fresh database, so each profiles
the workload first. Fixed ratios first (learning off), then learned runs from the given
starting ratios. Throughput is epochs trained per minute after `--warmup` seconds, in
trials' worth.

The relaunch delay: from the agent's report of a trial's exit to the next launch command
it receives for the same GPU (the server's decision and both hops; the process's own
start follows, see scripts/bench_trial_start.py --device cuda), p50 and p99 over the
runs' exits.

    python scripts/gpu_learned_ratio.py --sweep 2.5 --learn 2.5 --seconds 100
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_learned_ratio import one_run, parser

from hypersack.agent.agent import Agent
from hypersack.agent.devices import FakeBackend
from hypersack.agent.mps import MpsControl
from hypersack.agent.nvml import NvmlBackend

SPACE = """\
name: gpu-share
models: [{model}]
hyperparameters:
  batch_size: [{batch}]
  lr: {lrs}
settings:
  epochs: {epochs}
  fusion: "off"
  retries: 0
program:
  builtin: train
  options: {{dataset: synthetic, train_samples: {samples}, val_samples: 256}}
"""


class Relaunches:
    """Per GPU: when the agent reported each exit, and when each launch command came."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.exits: list[tuple[float, int]] = []
        self.launches: list[tuple[float, int]] = []

    def watch(self, agent: Agent) -> None:
        send, launch = agent._send, agent._launch

        def sending(outbox: Any, msg: Any, gpu: int | None = None) -> None:
            if msg.HasField("exited") and not msg.exited.killed:
                with self.lock:
                    self.exits.append((time.monotonic(), gpu if gpu is not None else -1))
            send(outbox, msg, gpu)

        def launching(m: Any, outbox: Any) -> None:
            with self.lock:
                self.launches.append((time.monotonic(), m.gpu_index))
            launch(m, outbox)

        agent._send = sending  # type: ignore[method-assign]
        agent._launch = launching  # type: ignore[method-assign]

    def delays(self) -> list[float]:
        """Each exit's wait for the first launch on its GPU after it (each launch
        answers one exit)."""
        out: list[float] = []
        used: set[int] = set()
        for t, gpu in sorted(self.exits):
            nxt = next((i for i, (u, g) in enumerate(self.launches)
                        if g == gpu and u >= t and i not in used), None)
            if nxt is not None:
                used.add(nxt)
                out.append(self.launches[nxt][0] - t)
        return out


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--model", default="resnet18", choices=["resnet18", "resnet34"],
                   help="the built-in trainer's model (resnet34 at a large batch keeps an H100 "
                        "busy, so each trial's profiled share is large and the ratio binds)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--samples", type=int, default=8192, help="training samples per epoch")
    p.add_argument("--cores", type=float, default=None,
                   help="cores the node reports to the server (default: its own); more than "
                        "it has lets the GPU's ratio, not the cores, bound how many trials run")
    p.add_argument("--fake", metavar="INVENTORY",
                   help="a dry run of the script on made-up GPUs (trials on the CPU, no MPS)")
    p.set_defaults(sweep=[2.5], learn=[2.5], seconds=100.0, learn_seconds=150.0,
                   warmup=25.0, epochs=6, trials=400, max_ratio=8.0)
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    backend = FakeBackend(args.fake, node="local") if args.fake else NvmlBackend()
    if args.cores is not None and not (math.isfinite(args.cores) and args.cores > 0):
        p.error(f"--cores must be a positive number (got {args.cores})")
    if args.cores is not None:
        backend.cores = lambda: float(args.cores)  # type: ignore[method-assign]
    devices = backend.devices()
    if not devices:
        raise SystemExit("no GPU found through NVML")
    arch = devices[0].arch
    lrs = [round(1e-4 * (i + 1), 6) for i in range(args.trials)]
    space = SPACE.format(model=args.model, batch=args.batch, lrs=json.dumps(lrs),
                         epochs=args.epochs,
                         samples=args.samples)
    print(f"{len(devices)} x {arch} ({devices[0].memory_mib} MiB); trials: {args.model}, "
          f"batch {args.batch}, {args.epochs} epochs of {args.samples} synthetic samples",
          flush=True)
    relaunch = Relaunches()
    rows = []
    for start, learn in [(r, False) for r in args.sweep] + [(r, True) for r in args.learn]:
        row = one_run(start, learn, args.learn_seconds if learn else args.seconds, args,
                      backend=backend, arch=arch, space=space,
                      mps=None if args.fake else (lambda root: MpsControl(root, devices)),
                      watch=relaunch.watch)
        rows.append(row)
        path = " ".join(f"{t:.0f}s:{q:g}" for t, _, _, q in row["timeline"][::5])
        print(f"{'learned from' if learn else 'fixed'} {start:g}: {row['per_min']:.2f} "
              f"trials/min after {args.warmup:g} s, {row['mean_running']:.1f} running on "
              f"average, final ratio {row['final_ratio']:g} ({row['samples']} samples, fit "
              f"(c, S, a) {row['fit']}); ratio over time: {path}", flush=True)
        print("  profiled demand (compute %, memory MiB, cores): " + ", ".join(
            f"({c:.1f}, {m}, {k:g})" for c, m, k in row["demands"]), flush=True)
    fixed = [r for r in rows if not r["learn"]]
    if fixed:
        best = max(fixed, key=lambda r: r["per_min"])
        for row in rows:
            if row["learn"] and best["per_min"] > 0:
                print(f"learned from {row['start']:g}: {row['per_min'] / best['per_min']:.2f} "
                      f"of fixed {best['start']:g}'s throughput")
    d = sorted(relaunch.delays())
    if d:
        print(f"relaunch delay, agent's exit report to the next launch on that GPU: "
              f"{len(d)} exits, p50 {1000 * statistics.median(d):.1f} ms, "
              f"p99 {1000 * d[int(0.99 * (len(d) - 1))]:.1f} ms, max {1000 * d[-1]:.1f} ms")


if __name__ == "__main__":
    main()
