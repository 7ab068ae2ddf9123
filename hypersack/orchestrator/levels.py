"""How a sharing level is shown (`hypersack nodes`, `why`, /metrics and the wire): one
architecture's ratio, where it came from, and the fits behind it (orchestrator/learned.py
builds them from the learner's state, orchestrator/sharing.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkloadFit:
    """One workload's own slowdown fit on an architecture (saturation 0: not believed)."""

    workload: str
    samples: int
    contention: float
    saturation_pct: float
    queued: float = 1.0

    def describe(self) -> str:
        if not self.saturation_pct:
            return f"{self.workload} ({self.samples} samples: {100 * self.contention:.0f} % " \
                "per extra trial, no saturation seen)"
        part = "" if self.queued >= 1.0 else f" for {100 * self.queued:.0f} % of an iteration"
        return f"{self.workload} ({self.samples} samples: {100 * self.contention:.0f} % per " \
            f"extra trial, queues past {self.saturation_pct:.0f} %{part})"


@dataclass(frozen=True)
class SharingLevel:
    """One architecture's ratio, as `hypersack nodes`, `why` and /metrics show it."""

    arch: str
    configured: float
    ratio: float
    learning: bool
    samples: int = 0
    needed: int = 0
    contention: float = 0.0
    saturation_pct: float = 0.0
    moves: int = 0
    queued: float = 1.0
    # Workloads with samples enough for a fit of their own (weighed by the running mix).
    workloads: tuple[WorkloadFit, ...] = ()
    foresight: str = ""  # the latest foresight behind its target (Foreseen.describe)

    def describe(self) -> str:
        if not self.learning:
            return f"{self.arch}: ratio {self.ratio:g} (configured; learning is off)"
        head = f"{self.arch}: ratio {self.ratio:g}"
        if abs(self.ratio - self.configured) > 1e-9:
            head += f" (learned, {self.moves} moves; configured {self.configured:g})"
        else:
            head += " (configured)"
        if self.samples < self.needed:
            return head + f"; learning: {self.samples} of {self.needed} samples"
        part = "" if self.queued >= 1.0 else f" for {100 * self.queued:.0f} % of an iteration"
        fitted = (f"; each extra trial costs {100 * self.contention:.0f} %, kernels queue "
                  f"past {self.saturation_pct:.0f} % load{part}") if self.saturation_pct \
            else ""
        own = "; by workload: " + ", ".join(w.describe() for w in self.workloads) \
            if self.workloads else ""
        seen = f"; {self.foresight}" if self.foresight else ""
        return head + f"; from {self.samples} samples{fitted}{own}{seen}"
