"""How co-located trials slow each other down in the simulator (docs/simulator.md).

A trial's solo iteration time t splits into GPU work (1 - f) and data loading f (the
profile's data_fraction, done on CPU cores). Sharing stretches both parts:

    iteration time = t * ((1 - f) * gpu_slowdown + f * cpu_slowdown)

gpu_slowdown = (1 + contention * (n - 1)) * max(1, L / saturation)
    n: trials on the GPU; L: the sum of their solo NVML utilization (percent);
    contention: the cost each extra MPS client adds (time slicing, cache and memory
    bandwidth sharing); saturation: the utilization the architecture absorbs from
    concurrent clients before its SMs are full and kernels queue.
cpu_slowdown = max(1, D / Q)
    D: the cores the node's running trials demand; Q: the node's cores.

Below saturation the aggregate throughput of a GPU, n / (1 + contention (n - 1)),
keeps rising with n; past it every added trial slows all of them by more than it adds,
so the speedup over one trial per GPU rises with the oversubscription ratio until the
packed load reaches the saturation point and falls after it. The defaults are calibrated
on SP1 with the example (estimated) profiles so that, as in the HyperSack paper, the
peak lies near ratio 3 on A100 (2.5 on H100, scaled alike) at about 2.8x; both are
parameters, and other workloads move the peak.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from hypersack.orchestrator.fits import Fit, slowdown


@dataclass(frozen=True)
class SharedTrial:
    compute_pct: float
    cores: float
    data_fraction: float


@dataclass(frozen=True)
class Interference:
    saturation_pct: Mapping[str, float] = field(
        default_factory=lambda: {"A100": 270.0, "H100": 225.0})
    default_saturation_pct: float = 200.0
    contention: float = 0.3
    # Per model: the share of its GPU time that queues past saturation (1 where not
    # named: all of it). A model bound by its host or memory copies queues less.
    queued: Mapping[str, float] = field(default_factory=dict)

    def saturation(self, arch: str) -> float:
        return self.saturation_pct.get(arch, self.default_saturation_pct)

    def gpu_slowdown(self, arch: str, trials: list[SharedTrial], model: str = "") -> float:
        """The GPU part's slowdown of a trial of `model` among `trials`."""
        n = len(trials)
        if n == 0:
            return 1.0
        load = sum(t.compute_pct for t in trials)
        a = self.queued.get(model, 1.0)
        return (1.0 + self.contention * (n - 1)) * \
            (1.0 - a + a * max(1.0, load / self.saturation(arch)))

    def gpu_slowdowns(self, arch: str, trials: list[SharedTrial], models: list[str]
                      ) -> list[float]:
        """Each trial's GPU slowdown, by its model's queued share."""
        if not self.queued:
            return [self.gpu_slowdown(arch, trials)] * len(trials)
        return [self.gpu_slowdown(arch, trials, m) for m in models]

    @staticmethod
    def cpu_slowdown(node_cores: float, trials: list[SharedTrial]) -> float:
        demand = sum(t.cores for t in trials)
        return max(1.0, demand / node_cores) if node_cores > 0 else 1.0

    @staticmethod
    def rate(trial: SharedTrial, gpu_slowdown: float, cpu_slowdown: float) -> float:
        """Progress per second of virtual time, in solo seconds (1.0 = as fast as alone)."""
        f = trial.data_fraction
        return 1.0 / ((1.0 - f) * gpu_slowdown + f * cpu_slowdown)


@dataclass(frozen=True)
class FittedInterference(Interference):
    """The interference a ratio learner believes (orchestrator/sharing.py): on an
    architecture with a fit, each trial's slowdown is its workload's fit (else the
    architecture's) of the whole iteration, as the samples measured it,
    (1 + c (n - 1)) (1 - a + a max(1, L / S)), with S only where the fit's saturation
    is believed; the node's cores slow it only where they slow it more. An architecture
    without a fit keeps the default model's GPU slowdown. The learner's foresight
    simulates with it (sim/foresight.py)."""

    fits: Mapping[str, Fit] = field(default_factory=dict)
    workload_fits: Mapping[str, Mapping[str, Fit]] = field(default_factory=dict)

    def gpu_slowdowns(self, arch: str, trials: list[SharedTrial], models: list[str]
                      ) -> list[float]:
        pooled = self.fits.get(arch)
        if pooled is None:
            return Interference.gpu_slowdowns(self, arch, trials, models)
        load = sum(t.compute_pct for t in trials)
        own = self.workload_fits.get(arch, {})
        return [slowdown(own.get(model, pooled), load, len(trials)) for model in models]

    @staticmethod
    def rate(trial: SharedTrial, gpu_slowdown: float, cpu_slowdown: float) -> float:
        return 1.0 / max(gpu_slowdown, cpu_slowdown)


def reports(models: list[str], rates: list[float]) -> list[tuple[str, float]]:
    """What the trials on one GPU would report to a learner, one sample per model (as
    the server takes one per trial): their iteration time over their solo one, data
    loading included (1 / rate), averaged over the model's trials there."""
    by: dict[str, list[float]] = {}
    for m, r in zip(models, rates, strict=True):
        by.setdefault(m, []).append(1.0 / r)
    return [(m, sum(xs) / len(xs)) for m, xs in sorted(by.items())]


def running_mix(gpus: list[tuple[str, list[str]]]) -> dict[str, dict[str, float]]:
    """Per architecture, the trials running by model, from (architecture, models) per GPU."""
    out: dict[str, dict[str, float]] = {}
    for arch, models in gpus:
        mix = out.setdefault(arch, {})
        for m in models:
            mix[m] = mix.get(m, 0.0) + 1.0
    return out
