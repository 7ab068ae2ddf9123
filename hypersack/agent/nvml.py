"""The NVML device backend: the only module that imports pynvml (nvidia-ml-py)."""

from __future__ import annotations

import logging
import os
import re
import threading
import time

from hypersack.agent.devices import DeviceBackend, DeviceState, Measured, Usage, busy_share
from hypersack.core.cluster import usable_cores
from hypersack.core.types import GpuSpec

log = logging.getLogger(__name__)

_ARCH = re.compile(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b")


def arch_of(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100', 'NVIDIA H100 80GB HBM3' -> 'H100'."""
    m = _ARCH.search(name.replace("NVIDIA", ""))
    return m.group(1) if m else name.replace(" ", "-")


def visible(devices: tuple[GpuSpec, ...], cuda_visible: str | None) -> tuple[GpuSpec, ...]:
    """The GPUs of `devices` (all of the node's, from NVML) that this agent may use:
    those CUDA_VISIBLE_DEVICES names when it is set (Slurm sets it from --gres, as do
    other batch systems and container runtimes), else all. Entries are NVML indexes or
    UUIDs (a unique prefix is enough, as for CUDA); as in CUDA, the list ends at the first
    entry that names no GPU, and an empty value means none."""
    if cuda_visible is None:
        return devices
    out: list[GpuSpec] = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if entry.isdigit():
            found = [d for d in devices if d.index == int(entry)]
        else:
            found = [d for d in devices if entry and d.uuid.startswith(entry)]
        if len(found) != 1 or found[0] in out:
            break
        out.append(found[0])
    return tuple(out)


MPS_SERVER = "nvidia-cuda-mps-server"


def process_name(pid: int) -> str:
    """A process's name (its /proc comm), or "" where it is gone or hidden."""
    import psutil

    try:
        return str(psutil.Process(pid).name())
    except psutil.Error:
        return ""


def nvml_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return False
    return count > 0


class NvmlBackend(DeviceBackend):
    observes = True
    name = "nvml"

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        devices = []
        handles = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // 2**20
            devices.append(GpuSpec(index=i, arch=arch_of(name), memory_mib=mem, uuid=uuid))
            handles.append(h)
        # Only the GPUs the batch system gave this agent (NVML sees every GPU of the node).
        given = visible(tuple(devices), os.environ.get("CUDA_VISIBLE_DEVICES"))
        if len(given) < len(devices):
            log.info("CUDA_VISIBLE_DEVICES=%s: using %d of the node's %d GPUs",
                     os.environ.get("CUDA_VISIBLE_DEVICES"), len(given), len(devices))
        self._handles = {d.index: handles[d.index] for d in given}
        self._devices = given
        # Per device being profiled: (time, utilization %) samples, memory samples.
        self._peaks: dict[int, tuple[list[tuple[float, float]], list[int]]] = {}
        self._util_seen: dict[int, int] = {}  # last process-utilization timestamp per device
        self._mps_servers: dict[int, bool] = {}  # pid -> whether it is an MPS server

    def devices(self) -> tuple[GpuSpec, ...]:
        return self._devices

    def cores(self) -> float:
        return float(usable_cores())

    def env_for(self, device: GpuSpec) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": device.uuid}

    def sample(self) -> list[DeviceState]:
        out = []
        for d in self._devices:
            h = self._handles[d.index]
            util = self._nvml.nvmlDeviceGetUtilizationRates(h).gpu
            used = int(self._nvml.nvmlDeviceGetMemoryInfo(h).used) // 2**20
            out.append(DeviceState(d.index, float(util), used))
        return out

    def versions(self) -> str:
        nv = self._nvml
        parts = []
        for name, call in (("driver", "nvmlSystemGetDriverVersion"),
                           ("nvml", "nvmlSystemGetNVMLVersion")):
            try:
                value = getattr(nv, call)()
                parts.append(f"{name}={value.decode() if isinstance(value, bytes) else value}")
            except Exception as exc:
                log.debug("%s failed: %s", call, exc)
        try:
            v = int(nv.nvmlSystemGetCudaDriverVersion())
            parts.append(f"cuda_driver={v // 1000}.{v % 1000 // 10}")
        except Exception as exc:
            log.debug("nvmlSystemGetCudaDriverVersion failed: %s", exc)
        return " ".join(parts)

    def observe(self, jobs: dict[str, tuple[GpuSpec, list[int]]]) -> dict[str, Usage]:
        """GPU memory (per process, from the running-process list) and SM utilization
        (per-process samples since the last call; the device's, for a trial alone on its
        GPU where NVML has none, as under MPS) of each trial's processes."""
        nv = self._nvml
        by_device: dict[int, list[str]] = {}
        for job_id, (device, _) in jobs.items():
            by_device.setdefault(device.index, []).append(job_id)
        out = {}
        for index, job_ids in by_device.items():
            h = self._handles[index]
            try:
                memory = {p.pid: int(p.usedGpuMemory or 0) // 2**20
                          for p in nv.nvmlDeviceGetComputeRunningProcesses(h)}
            except Exception as exc:
                log.debug("NVML process list failed: %s", exc)
                continue
            util: dict[int, float] = {}
            try:
                last = self._util_seen.get(index, 0)
                for sample in nv.nvmlDeviceGetProcessUtilization(h, last):
                    util[sample.pid] = max(util.get(sample.pid, 0.0), float(sample.smUtil))
                    self._util_seen[index] = max(self._util_seen.get(index, 0),
                                                 int(sample.timeStamp))
            except Exception as exc:  # no samples yet, or not supported (MPS clients)
                log.debug("NVML process utilization: %s", exc)
            alone = 0.0
            ours = {pid for job_id in job_ids for pid in jobs[job_id][1]}
            busy = {pid for pid, u in util.items() if u > 0}
            if len(job_ids) == 1 and not busy & ours and all(map(self._mps_server, busy)):
                # Under MPS NVML keeps no utilization per client: it has no samples, or
                # (an H100, driver 580) it counts the GPU's work to the MPS server's
                # process. A trial alone on its GPU owns the device's: without it a
                # profile that read too low (its compute share) would never be corrected
                # by what the trial uses. Any other busy process is someone else's.
                try:
                    alone = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                except Exception as exc:
                    log.debug("NVML utilization: %s", exc)
            for job_id in job_ids:
                pids = jobs[job_id][1]
                mem = sum(memory.get(pid, 0) for pid in pids)
                if mem:
                    out[job_id] = Usage(mem, max((util.get(pid, 0.0) for pid in pids),
                                                 default=0.0) or alone)
        return out

    def _mps_server(self, pid: int) -> bool:
        known = self._mps_servers.get(pid)
        if known is None:
            if len(self._mps_servers) > 1024:
                self._mps_servers.clear()
            known = self._mps_servers[pid] = process_name(pid) == MPS_SERVER
        return known

    def start_measuring(self, device: GpuSpec, pid: int) -> None:
        """Sample the device every 50 ms while the profile run lives (it is alone there)."""
        import psutil

        utils: list[tuple[float, float]] = []
        mems: list[int] = []
        self._peaks[device.index] = (utils, mems)
        h = self._handles[device.index]

        def loop() -> None:
            while psutil.pid_exists(pid):
                try:
                    utils.append((time.time(),
                                  float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu)))
                    procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(h)
                    mine = [p.usedGpuMemory for p in procs if p.usedGpuMemory]
                    mems.append(int(sum(mine)) // 2**20)
                except Exception as exc:
                    log.debug("NVML sample failed: %s", exc)
                time.sleep(0.05)

        threading.Thread(target=loop, daemon=True, name=f"nvml-{pid}").start()

    def demand(self, device: GpuSpec, measured: Measured) -> tuple[float, int, float]:
        utils, mems = self._peaks.pop(device.index, ([], []))
        # Over the timed iterations only: the whole run's mean counted the process's
        # start as idle (a ResNet-34 that keeps an H100 busy profiled at 6 %).
        share = busy_share(utils, measured.window)
        compute = 1.0 if share is None else share
        memory = max(mems, default=0)
        return (round(max(1.0, compute), 2), max(1, memory), self.cores_of(measured))
