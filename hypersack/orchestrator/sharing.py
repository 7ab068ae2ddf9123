"""How far to pack each architecture, learned from the slowdown trials show (issue 38).

Samples are (placed load L: the sum of the solo compute shares of the trials on a GPU,
in percent; n: how many; slowdown: observed iteration time over the solo one). The
model is the simulator's family (sim/interference.py):

    slowdown = (1 + c (n - 1)) * max(1, L / S)

c: what each extra client costs; S: the load the architecture absorbs before kernels
queue. A GPU packed to ratio r holds about n = 100 r / u trials (u: a trial's mean solo
share) at load 100 r, and progresses sum(1 / slowdown) = n / slowdown solo-seconds per
second; the ratio chosen maximizes that within [low, high].

Acting on an estimate needs `min_samples` samples; S is only known once some samples
lie past it (otherwise the best ratio is at least the load seen, and the ratio steps up
only if GPUs were packed to 80 % of it). Each decision moves a ratio by at most `step`, so a
bad estimate cannot swing the cluster. Pure: the caller feeds samples and applies the
ratios it returns (the simulator today; the server's wiring is still to come).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

SATURATION_GRID = tuple(float(s) for s in range(50, 1005, 5))  # percent


@dataclass(frozen=True)
class Fit:
    contention: float
    saturation_pct: float
    samples: int
    past_saturation: int  # samples whose load is past the saturation found
    max_load_pct: float
    mean_share_pct: float  # a trial's mean solo compute share (L / n)


def fit(samples: Sequence[tuple[float, int, float]]) -> Fit | None:
    """Least squares on log slowdown over a grid of S, c in closed form for each (the
    smallest S among equally good ones: none past it means only 'at least the load
    seen', which `past_saturation` says)."""
    usable = [(load, n, s) for load, n, s in samples
              if n >= 1 and load > 0 and s > 0 and math.isfinite(s) and math.isfinite(load)]
    if not usable:
        return None
    best: tuple[float, float, float] | None = None  # (sse, S, c)
    den = sum((n - 1) ** 2 for _, n, _ in usable)  # the same for every S
    for sat in SATURATION_GRID:
        num = sum((s / max(1.0, load / sat) - 1.0) * (n - 1) for load, n, s in usable)
        c = max(0.0, num / den) if den > 0 else 0.0
        sse = sum((math.log(s) - math.log((1 + c * (n - 1)) * max(1.0, load / sat))) ** 2
                  for load, n, s in usable)
        if best is None or sse < best[0] - 1e-12:
            best = (sse, sat, c)
    assert best is not None
    _, sat, c = best
    max_load = max(load for load, _, _ in usable)
    past = sum(1 for load, _, _ in usable if load > sat)
    # With no sample past it, the fit's S is only 'at least the largest load seen'.
    if past == 0:
        sat = max(sat, max_load)
    share = sum(load / n for load, n, _ in usable) / len(usable)
    return Fit(c, sat, len(usable), past, max_load, share)


def throughput(ratio: float, f: Fit) -> float:
    """Solo-seconds of progress per second of a GPU packed to `ratio` under `f`."""
    n = max(1.0, 100.0 * ratio / max(f.mean_share_pct, 1e-9))
    return n / ((1 + f.contention * (n - 1)) * max(1.0, 100.0 * ratio / f.saturation_pct))


class RatioLearner:
    """Per architecture: the samples (the latest `window`), and the ratio in force."""

    def __init__(self, configured: Mapping[str, float], *, low: float = 1.0,
                 high: float = 4.0, step: float = 0.25, min_samples: int = 40,
                 every: int = 40, window: int = 400) -> None:
        if not 0 < low <= high:
            raise ValueError("ratio bounds: 0 < low <= high")
        self.low, self.high, self.step = low, high, step
        self.min_samples, self.every = min_samples, every
        self.ratios: dict[str, float] = {a: min(high, max(low, r))
                                         for a, r in configured.items()}
        self.samples: dict[str, deque[tuple[float, int, float]]] = {}
        self.window = window
        self._new: dict[str, int] = {}
        self.fits: dict[str, Fit] = {}  # the latest, shown with the ratio

    def observe(self, arch: str, load_pct: float, n: int, slowdown: float) -> float | None:
        """One sample; the architecture's new ratio when this one moved it."""
        if arch not in self.ratios or n < 1 or not (slowdown > 0 and math.isfinite(slowdown)):
            return None
        q = self.samples.setdefault(arch, deque(maxlen=self.window))
        q.append((load_pct, n, slowdown))
        self._new[arch] = self._new.get(arch, 0) + 1
        if self._new[arch] < self.every:
            return None
        self._new[arch] = 0
        return self.decide(arch)

    def decide(self, arch: str) -> float | None:
        q = self.samples.get(arch, ())
        if len(q) < self.min_samples:
            return None
        f = fit(list(q))
        if f is None:
            return None
        self.fits[arch] = f
        current = self.ratios[arch]
        if f.past_saturation >= max(3, len(q) // 20):
            target = max((self.low + i * 0.05 for i in
                          range(round((self.high - self.low) / 0.05) + 1)),
                         key=lambda r: (throughput(r, f), -r))
        elif f.max_load_pct >= 0.8 * 100.0 * current:
            # Packed to the ratio and still short of saturation, which lies beyond what
            # was seen: more pays unless each client costs as much as it adds (c >= 1).
            unsaturated = replace(f, saturation_pct=math.inf)
            target = current + self.step if throughput(current + self.step, unsaturated) > \
                throughput(current, unsaturated) else current
        else:
            return None  # not packed near the ratio: nothing says where it lies
        new = min(self.high, max(self.low, current + max(-self.step,
                                                          min(self.step, target - current))))
        if abs(new - current) < 1e-9:
            return None
        self.ratios[arch] = new
        return new
