"""The NVML device backend: the only module that imports pynvml (nvidia-ml-py)."""

from __future__ import annotations

import logging
import re
import threading
import time

from hypersack.agent.devices import DeviceBackend, DeviceState, Measured, _usable_cores
from hypersack.core.types import GpuSpec

log = logging.getLogger(__name__)

_ARCH = re.compile(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b")


def arch_of(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'A100', 'NVIDIA H100 80GB HBM3' -> 'H100'."""
    m = _ARCH.search(name.replace("NVIDIA", ""))
    return m.group(1) if m else name.replace(" ", "-")


def nvml_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return False
    return count > 0


class NvmlBackend(DeviceBackend):
    name = "nvml"

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        devices = []
        self._handles = []
        for i in range(int(pynvml.nvmlDeviceGetCount())):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            name = name.decode() if isinstance(name, bytes) else str(name)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            mem = int(pynvml.nvmlDeviceGetMemoryInfo(h).total) // 2**20
            devices.append(GpuSpec(index=i, arch=arch_of(name), memory_mib=mem, uuid=uuid))
            self._handles.append(h)
        self._devices = tuple(devices)
        self._peaks: dict[int, tuple[list[float], list[int]]] = {}

    def devices(self) -> tuple[GpuSpec, ...]:
        return self._devices

    def cores(self) -> float:
        return _usable_cores()

    def env_for(self, device: GpuSpec) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": device.uuid}

    def sample(self) -> list[DeviceState]:
        out = []
        for d, h in zip(self._devices, self._handles, strict=False):
            util = self._nvml.nvmlDeviceGetUtilizationRates(h).gpu
            used = int(self._nvml.nvmlDeviceGetMemoryInfo(h).used) // 2**20
            out.append(DeviceState(d.index, float(util), used))
        return out

    def start_measuring(self, device: GpuSpec, pid: int) -> None:
        """Sample the device every 50 ms while the profile run lives (it is alone there)."""
        import psutil

        utils: list[float] = []
        mems: list[int] = []
        self._peaks[device.index] = (utils, mems)
        h = self._handles[device.index]

        def loop() -> None:
            while psutil.pid_exists(pid):
                try:
                    utils.append(float(self._nvml.nvmlDeviceGetUtilizationRates(h).gpu))
                    procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(h)
                    mine = [p.usedGpuMemory for p in procs if p.usedGpuMemory]
                    mems.append(int(sum(mine)) // 2**20)
                except Exception as exc:
                    log.debug("NVML sample failed: %s", exc)
                time.sleep(0.05)

        threading.Thread(target=loop, daemon=True, name=f"nvml-{pid}").start()

    def demand(self, device: GpuSpec, measured: Measured) -> tuple[float, int, float]:
        utils, mems = self._peaks.pop(device.index, ([], []))
        busy = utils[len(utils) // 5:] or utils  # skip start-up
        compute = sum(busy) / len(busy) if busy else 1.0
        memory = max(mems, default=0)
        return (round(max(1.0, compute), 2), max(1, memory),
                round(max(0.01, measured.cpu_cores), 3))
