"""What the agent's NVML backend sees a running trial use (needs an NVIDIA GPU): one
busy process alone on GPU 0, then two at once, each observed once a second through
`NvmlBackend.observe` as the agent does. Run it with MPS on and off
(scripts/gpu_checks.sh, part `observe`): under MPS NVML keeps no per-process
utilization, and a trial alone on its GPU is to be seen at the device's.

    python scripts/gpu_observe.py --seconds 8
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypersack.agent.nvml import NvmlBackend

BUSY = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda")
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    a @ a
    torch.cuda.synchronize()
"""


def raw(backend: NvmlBackend) -> dict[str, object]:
    """What NVML itself lists on GPU 0: processes (pid, MiB, name) and the utilization
    samples of the last two seconds (pid, SM %)."""
    import psutil

    nv = backend._nvml
    h = backend._handles[0]
    procs = []
    for p in nv.nvmlDeviceGetComputeRunningProcesses(h):
        try:
            name = psutil.Process(p.pid).name()
        except psutil.Error:
            name = "?"
        procs.append((p.pid, int(p.usedGpuMemory or 0) // 2**20, name))
    try:
        since = int((time.time() - 2) * 1e6)
        samples = sorted({(s.pid, s.smUtil) for s in
                          nv.nvmlDeviceGetProcessUtilization(h, since)})
    except Exception as exc:
        samples = [str(exc)]
    return {"procs": procs, "samples": samples}


def observe(backend: NvmlBackend, procs: int, seconds: float) -> list[dict[str, object]]:
    device = backend.devices()[0]
    children = [subprocess.Popen([sys.executable, "-c", BUSY, str(seconds)],
                                 stdout=subprocess.PIPE, text=True) for _ in range(procs)]
    for c in children:
        assert c.stdout is not None
        c.stdout.readline()  # its CUDA context is up
    jobs = {f"t{i}": (device, [c.pid]) for i, c in enumerate(children)}
    rows = []
    began = time.time()
    while all(c.poll() is None for c in children) and time.time() - began < seconds:
        time.sleep(1.0)
        seen = backend.observe(jobs)
        state = backend.sample()[0]
        print("raw", raw(backend), flush=True)
        rows.append({"t": round(time.time() - began, 1), "device_util": state.utilization_pct,
                     **{j: None if u is None else {"memory_mib": u.memory_mib,
                                                   "util": u.utilization_pct}
                        for j, u in ((j, seen.get(j)) for j in jobs)}})
        print(json.dumps(rows[-1]), flush=True)
    for c in children:
        c.wait()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    mps = bool(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
    backend = NvmlBackend()
    print(f"MPS: {'on' if mps else 'off'}; {backend.devices()[0]}")
    for procs in (1, 2):
        print(f"== {procs} process(es) on GPU 0")
        rows = observe(backend, procs, args.seconds)
        seen = [r for r in rows[1:] if r.get("t0")]
        utils = [r["t0"]["util"] for r in seen]  # type: ignore[index]
        dev = [r["device_util"] for r in rows[1:]]
        print(f"summary procs={procs} mps={mps}: trial t0 seen in {len(seen)} of "
              f"{len(rows) - 1} samples, util {utils}, device {dev}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
