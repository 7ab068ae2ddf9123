"""A profile that read too low, corrected by what its running trial uses, end to end on a
real GPU (needs an NVIDIA GPU): a server and an agent with NVML (MPS on or off), the
ResNet-34 batch-512 profile imported at `--low` % compute, then one such trial run
alone. The agent reports the trial's utilization with its heartbeats (under MPS, where
NVML keeps none per client, the device's for a trial alone on its GPU), and the server
raises the profile's demand once it is exceeded by more than a quarter. Prints the
profile's compute demand over the trial's life.

    python scripts/gpu_feedback.py --seconds 40 --low 10          # MPS on
    python scripts/gpu_feedback.py --seconds 40 --low 10 --no-mps
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cpu_learned_ratio import serve_agent
from gpu_learned_ratio import SPACE

from hypersack.agent.agent import Agent
from hypersack.agent.devices import DeviceBackend, FakeBackend
from hypersack.agent.guard import CommandPolicy
from hypersack.agent.mps import MpsControl
from hypersack.agent.nvml import NvmlBackend
from hypersack.cli.client import Client
from hypersack.core.types import Demand, Profile, WorkloadKey
from hypersack.server.app import HyperSackServer
from hypersack.wire.settings import ServerSettings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--low", type=float, default=10.0, help="the imported compute share, %%")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--samples", type=int, default=8192)
    ap.add_argument("--no-mps", action="store_true")
    ap.add_argument("--fake", metavar="INVENTORY",
                    help="a dry run of the script on made-up GPUs (the trial on the CPU, no "
                         "MPS, nothing observed)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    backend: DeviceBackend = FakeBackend(args.fake, node="local") if args.fake else NvmlBackend()
    args.no_mps = args.no_mps or bool(args.fake)
    devices = backend.devices()
    if not devices:
        raise SystemExit("no GPU found through NVML")
    arch = devices[0].arch
    key = WorkloadKey(model="resnet34", batch_size=512)
    low = Profile(key=key, arch=arch, demand=Demand(compute_pct=args.low, memory_mib=7276,
                                                     cores=2.0),
                  iter_time_s=0.1, iters_per_epoch=16, source="imported (too low)")
    with tempfile.TemporaryDirectory(prefix="hs-feedback-") as tmp:
        state = Path(tmp)
        server = HyperSackServer(ServerSettings(
            listen="127.0.0.1:0", db=state / "run.db", heartbeat_interval_s=1.0,
            heartbeat_timeout_s=60.0, tick_interval_s=0.5))
        server.start()
        server.service.import_profiles([low], replace=True)
        agent = Agent(server.address, "local", backend, state / "work", poll_interval_s=0.1,
                      commands=CommandPolicy.permissive(), inherit_env=True,
                      mps=None if args.no_mps else MpsControl(state / "mps", devices))
        thread = serve_agent(server, agent)
        try:
            print(f"{arch}, MPS {'off' if args.no_mps else 'on'}; imported "
                  f"{key.label()} at {args.low:g} % compute", flush=True)
            with Client(server.address) as client:
                space = SPACE.format(model="resnet34", batch=512, lrs="[0.01]",
                                     epochs=args.epochs, samples=args.samples)
                study = client.submit(space, "feedback.yaml").id
                start = time.monotonic()
                first = None
                while (elapsed := time.monotonic() - start) < args.seconds:
                    p = next(p for p in server.service.profiles("resnet34", arch)
                             if p.key == key)
                    running = client.study(study).counts.get("RUNNING", 0)
                    print(f"{elapsed:5.1f} s: running {running}, demand "
                          f"{p.demand.compute_pct:.1f} %, observed "
                          f"{p.observed_compute_pct:.1f} % ({p.observed_trials} trial(s))"
                          + (f"; corrected: {p.corrected}" if p.corrected else ""), flush=True)
                    if first is None and p.demand.compute_pct > args.low:
                        first = elapsed
                    time.sleep(2.0)
                client.cancel(study)
            p = next(p for p in server.service.profiles("resnet34", arch) if p.key == key)
            print(f"summary mps={'off' if args.no_mps else 'on'}: demand {args.low:g} % -> "
                  f"{p.demand.compute_pct:.1f} %"
                  + (f", first raised at {first:.1f} s" if first is not None else
                     ", never raised"), flush=True)
        finally:
            agent.stop()
            thread.join(timeout=15)
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
