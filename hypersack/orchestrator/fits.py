"""The slowdown model a ratio learner fits (orchestrator/sharing.py) and the simulator's
FittedInterference (sim/interference.py) asks: samples are (placed load L, the sum of
the solo compute shares of the trials on a GPU, in percent; n, how many; slowdown,
observed iteration time over the solo one), explained as

    slowdown = (1 + c (n - 1)) * (1 - a + a max(1, L / S))

c: what each extra client costs; S: the load the architecture absorbs before kernels
queue; a: the share of each iteration that queues past saturation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

SATURATION_GRID = tuple(float(s) for s in range(50, 1005, 5))  # percent
QUEUED_GRID = (0.25, 0.5, 0.75, 1.0)  # the share of an iteration that queues


@dataclass(frozen=True)
class Fit:
    contention: float
    saturation_pct: float
    samples: int
    past_saturation: int  # samples whose load is past the saturation found
    max_load_pct: float
    mean_share_pct: float  # a trial's mean solo compute share (L / n)
    queued: float = 1.0  # a: the share of an iteration that queues past saturation


# A saturation point is believed only where it explains the samples clearly better than
# contention alone: its residual at most this share of contention alone's, and smaller
# by at least SATURATION_GAIN per sample. Samples at one load are explained as well by
# either; taking them for saturation would keep a ratio set too low from ever rising.
SATURATION_RESIDUAL = 0.7
SATURATION_GAIN = 1e-3


def fit(samples: Sequence[tuple[float, int, float]]) -> Fit | None:
    """Least squares on log slowdown over a grid of (S, a), c in closed form for each
    (among equally good ones the largest a, then the smallest S), against contention
    alone (no saturation): S is only 'at least the largest load seen' unless saturation
    explains the samples clearly better, and then `past_saturation` counts the samples
    past it."""
    usable = [(load, n, s) for load, n, s in samples
              if n >= 1 and load > 0 and s > 0 and math.isfinite(s) and math.isfinite(load)]
    if not usable:
        return None
    load = np.array([x[0] for x in usable])
    extra = np.array([x[1] - 1.0 for x in usable])
    slow = np.array([x[2] for x in usable])
    den = float(extra @ extra)
    # Rows by a, the whole of an iteration first (the simulator's family: samples it
    # explains as well as a smaller share does not need one), then by S, smallest first.
    queued = np.repeat(np.array(sorted(QUEUED_GRID, reverse=True)), len(SATURATION_GRID))
    sats = np.tile(np.array(SATURATION_GRID), len(QUEUED_GRID))
    # One row per (S, a): each sample's queueing factor, c, and the squared error.
    q = 1.0 - queued[:, None] + queued[:, None] * np.maximum(1.0, load[None, :] /
                                                             sats[:, None])
    q = np.vstack([q, np.ones_like(load)])  # the last row: contention alone
    c = np.maximum(0.0, ((slow / q - 1.0) @ extra) / den) if den > 0 else \
        np.zeros(len(q))
    sse = ((np.log(slow) - np.log((1.0 + c[:, None] * extra) * q)) ** 2).sum(axis=1)
    free_sse = float(sse[-1])
    # The first of the best, within rounding.
    i = int(np.flatnonzero(sse[:-1] <= sse[:-1].min() + 1e-12)[0])
    best_sse, sat, share_queued, cont = float(sse[i]), float(sats[i]), float(queued[i]), \
        float(c[i])
    max_load = float(load.max())
    if best_sse > SATURATION_RESIDUAL * free_sse or \
            free_sse - best_sse < SATURATION_GAIN * len(usable):
        sat, share_queued, cont = max_load, 1.0, float(c[-1])
    past = int((load > sat).sum())
    share = float((load / (extra + 1.0)).mean())
    return Fit(cont, sat, len(usable), past, max_load, share, share_queued)


def throughput(ratio: float, f: Fit) -> float:
    """Solo-seconds of progress per second of a GPU packed to `ratio` under `f`."""
    n = max(1.0, 100.0 * ratio / max(f.mean_share_pct, 1e-9))
    queued = 1.0 - f.queued + f.queued * max(1.0, 100.0 * ratio / f.saturation_pct)
    return n / ((1 + f.contention * (n - 1)) * queued)


def believed(f: Fit) -> bool:
    """Whether a fit's saturation point explains enough samples past it to act on."""
    return f.past_saturation >= max(3, f.samples // 20)


def mixed_throughput(ratio: float, parts: Sequence[tuple[float, Fit]]) -> float:
    """Solo-seconds of progress per second of a GPU packed to `ratio` with trials of
    several workloads, each (weight: its share of the trials, fit) slowed as its own fit
    says; a fit whose saturation is not believed is taken as contention alone."""
    total = sum(w for w, _ in parts)
    if total <= 0:
        return 0.0
    share = sum(w * f.mean_share_pct for w, f in parts) / total
    n = max(1.0, 100.0 * ratio / max(share, 1e-9))
    load = 100.0 * ratio
    return sum((w / total) * n / slowdown(f, load, n) for w, f in parts)


def slowdown(f: Fit, load_pct: float, n: float) -> float:
    """A trial's slowdown under `f` on a GPU holding `n` trials at `load_pct`; a fit
    whose saturation is not believed is taken as contention alone. The progress model
    above and the simulator's FittedInterference both ask it."""
    sat = f.saturation_pct if believed(f) and f.saturation_pct > 0 else math.inf
    return (1.0 + f.contention * (n - 1)) * (1.0 - f.queued + f.queued * max(1.0, load_pct / sat))
