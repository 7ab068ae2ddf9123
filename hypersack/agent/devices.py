"""Device backends: what a node has and how a trial is pointed at one of its devices.

`cpu` treats the machine's CPU as one device (arch "CPU"), so the whole system runs
real trials without a GPU. `fake` reports a given inventory (`4xA100-80GB@88`) for
tests and for demos of a cluster on one machine; its trials run on the CPU. `nvml`
(in `hypersack.agent.nvml`, the only module that imports pynvml) reads real GPUs.
"""

from __future__ import annotations

import math
import platform
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import psutil

from hypersack.core.cluster import parse_shorthand, usable_cores
from hypersack.core.errors import InvalidInput
from hypersack.core.types import GpuSpec

BACKENDS = ("auto", "nvml", "cpu", "fake")


@dataclass(frozen=True)
class DeviceState:
    index: int
    utilization_pct: float
    memory_used_mib: int


@dataclass(frozen=True)
class Measured:
    """What a profile run measured on the trial side (through the SDK)."""

    cpu_cores: float
    peak_rss_mib: float
    # When its timed iterations ran (wall clock, seconds since the epoch): the device's
    # samples in this window are the workload's use; those before it are the process's
    # start (imports, CUDA context, data), which is most of a short profile run's life.
    window: tuple[float, float] | None = None


def profile_window(value: object, life: tuple[float, float]) -> tuple[float, float] | None:
    """A profile result's `window` ([start, end] in seconds since the epoch) cut to the
    process's `life`, or None where it is missing, not two finite, ordered numbers, or
    outside that life (the result is the trial's output: hostile)."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    try:
        start, end = (float(v) for v in value)
    except (TypeError, ValueError):
        return None
    if not (math.isfinite(start) and math.isfinite(end) and start <= end):
        return None
    start, end = max(start, life[0]), min(end, life[1])
    return (start, end) if start <= end else None


# NVML's utilization is the share of its last sample period (1/6 s to 1 s by device)
# with a kernel running, so the readings just after the window still tell of it.
WINDOW_GRACE_S = 0.25


def busy_share(samples: Sequence[tuple[float, float]],
               window: tuple[float, float] | None) -> float | None:
    """A profile run's compute share (%) from the device's utilization samples (time,
    %): their mean within its timed window (and NVML's averaging period after it); the
    first sample after the window's start where the window fell between two samples.
    Without a window (a program that marks no iterations: its whole run is its profile),
    the mean after the first fifth of the run (its start). None: no samples."""
    if not samples:
        return None
    if window is not None:
        start, end = window
        inside = [u for t, u in samples if start < t <= end + WINDOW_GRACE_S]
        if inside:
            return sum(inside) / len(inside)
        after = [u for t, u in samples if t > start]
        if after:
            return after[0]
    busy = [u for _, u in samples[len(samples) // 5:]] or [u for _, u in samples]
    return sum(busy) / len(busy)


@dataclass(frozen=True)
class Usage:
    """What one trial's processes use of their device now."""

    memory_mib: int
    utilization_pct: float


class DeviceBackend(ABC):
    name: str
    observes = False  # True: observe() measures trials (worth a process scan)

    @abstractmethod
    def devices(self) -> tuple[GpuSpec, ...]: ...

    @abstractmethod
    def cores(self) -> float: ...

    @abstractmethod
    def env_for(self, device: GpuSpec) -> dict[str, str]:
        """Environment that confines a trial to one device."""

    def sample(self) -> list[DeviceState]:
        return [DeviceState(d.index, 0.0, 0) for d in self.devices()]

    def observe(self, jobs: dict[str, tuple[GpuSpec, list[int]]]) -> dict[str, Usage]:
        """Each running trial's use of its device, by job id (`jobs`: device and process
        ids). A backend that cannot tell leaves a trial out; the fake one tells nothing."""
        return {}

    def versions(self) -> str:
        """Driver and system versions recorded with a profile."""
        return f"kernel={platform.release()}"

    def start_measuring(self, device: GpuSpec, pid: int) -> None:  # noqa: B027
        """Begin sampling a profile run's device use (NVML); nothing by default."""

    def demand(self, device: GpuSpec, measured: Measured) -> tuple[float, int, float]:
        """(compute %, memory MiB, cores) of a profile run; floors keep demands positive."""
        compute = min(100.0, max(1.0, 100.0 * measured.cpu_cores))
        return (round(compute, 2), max(1, round(measured.peak_rss_mib)), self.cores_of(measured))

    def cores_of(self, measured: Measured) -> float:
        """The cores a profile run used, at most the node's (a short run's CPU time can
        read a little more than wall time times cores, and such a demand never fits)."""
        return round(min(self.cores(), max(0.01, measured.cpu_cores)), 3)


class CpuBackend(DeviceBackend):
    """The whole CPU as one device: compute % is the share of all cores a trial uses."""

    observes = True

    name = "cpu"

    def __init__(self) -> None:
        total = psutil.virtual_memory().total // 2**20
        self._device = GpuSpec(index=0, arch="CPU", memory_mib=max(1, int(total * 0.8)),
                               uuid="cpu")
        self._procs: dict[int, psutil.Process] = {}

    def devices(self) -> tuple[GpuSpec, ...]:
        return (self._device,)

    def cores(self) -> float:
        return float(usable_cores())

    def env_for(self, device: GpuSpec) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": ""}

    def sample(self) -> list[DeviceState]:
        vm = psutil.virtual_memory()
        return [DeviceState(0, psutil.cpu_percent(interval=None),
                            (vm.total - vm.available) // 2**20)]

    def observe(self, jobs: dict[str, tuple[GpuSpec, list[int]]]) -> dict[str, Usage]:
        """Resident memory and CPU share (of all cores) of each trial's processes."""
        out = {}
        live: dict[int, psutil.Process] = {}
        for job_id, (_, pids) in jobs.items():
            rss, cpu = 0, 0.0
            for pid in pids:
                proc = self._procs.get(pid)
                try:
                    if proc is None:
                        proc = psutil.Process(pid)
                        proc.cpu_percent(None)  # the first call starts the interval
                    rss += proc.memory_info().rss
                    cpu += proc.cpu_percent(None)
                    live[pid] = proc
                except psutil.Error:
                    continue
            if rss:
                out[job_id] = Usage(rss // 2**20, round(min(100.0, cpu / self.cores()), 2))
        self._procs = live
        return out

    def demand(self, device: GpuSpec, measured: Measured) -> tuple[float, int, float]:
        compute = min(100.0, max(1.0, 100.0 * measured.cpu_cores / self.cores()))
        return (round(compute, 2), max(1, round(measured.peak_rss_mib)), self.cores_of(measured))


class FakeBackend(DeviceBackend):
    """A made-up inventory; trials run on the CPU with no GPU visible."""

    name = "fake"

    def __init__(self, inventory: str, node: str = "fake") -> None:
        text = inventory.strip()
        if text.count("x") < 2:
            text = "1x" + text
        cluster = parse_shorthand(text)
        if len(cluster.nodes) != 1:
            raise InvalidInput(f"fake inventory {inventory!r}: describe one node, like "
                               "4xA100-80GB@88")
        spec = cluster.nodes[0]
        self._cores = spec.cores
        self._devices = tuple(g.model_copy(update={"uuid": f"FAKE-{node}-{g.index}"})
                              for g in spec.gpus)

    def devices(self) -> tuple[GpuSpec, ...]:
        return self._devices

    def cores(self) -> float:
        return self._cores

    def env_for(self, device: GpuSpec) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": "", "HYPERSACK_FAKE_DEVICE": device.uuid}

    def versions(self) -> str:
        return f"fake {super().versions()}"


def make_backend(name: str, *, inventory: str | None = None, node: str = "node") -> DeviceBackend:
    if name not in BACKENDS:
        raise InvalidInput(f"unknown device backend {name!r}; valid: {', '.join(BACKENDS)}")
    if name == "fake":
        if not inventory:
            raise InvalidInput("the fake backend needs an inventory, like --inventory "
                               "4xA100-80GB@88")
        return FakeBackend(inventory, node)
    if inventory:
        raise InvalidInput("--inventory is for the fake backend only")
    if name in ("nvml", "auto"):
        from hypersack.agent.nvml import NvmlBackend, nvml_available

        if nvml_available():
            return NvmlBackend()
        if name == "nvml":
            raise InvalidInput("the nvml backend needs an NVIDIA driver and GPU; none found "
                               "(use --backend cpu to run trials on the CPU)")
    return CpuBackend()
