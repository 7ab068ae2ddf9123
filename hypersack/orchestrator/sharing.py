"""How far to pack each architecture, learned from the slowdown trials show (issue 38).

Samples are (placed load L: the sum of the solo compute shares of the trials on a GPU,
in percent; n: how many; slowdown: observed iteration time over the solo one). The
model is the simulator's family (sim/interference.py), with the share of an iteration
that queues past saturation:

    slowdown = (1 + c (n - 1)) * (1 - a + a max(1, L / S))

c: what each extra client costs; S: the load the architecture absorbs before kernels
queue; a: the share of each iteration that queues (1: all of it, as in the simulator; a
trial that also waits on I/O or its host is slowed only in part). A GPU packed to ratio
r holds about n = 100 r / u trials (u: a trial's mean solo share) at load 100 r, and
progresses sum(1 / slowdown) = n / slowdown solo-seconds per second; the ratio chosen
is the largest within 1 % of the most progress the fit predicts in [low, high].

Per workload (a sample's trial's model), where the data supports it: a workload with
`min_samples` samples of its own in the window gets its own fit, and the decision weighs
each workload's fit by its share of the trials running on that architecture now (the
caller's `mix`); the trials of workloads without a fit of their own are weighed by the
fit of those workloads' samples together, or of every sample, and where they are most of
what runs and have fewer than `min_samples` samples the ratio holds until they have
them (a new mix is not packed on the old one's estimate). A decision without a mix uses
the fit of every sample. So when the mix changes (a study of transformers
follows one of CNNs), the ratio follows the workloads running, not the window's past
mix: with two workloads whose kernels queue for all and for a fifth of an iteration, the
pooled fit's ratio gave 0.84-0.97 of the best progress after the mix moved, the
per-workload one 0.99-1.00 (tests/unit/test_sharing.py).

Acting on an estimate needs `min_samples` samples; S is only known once some samples
lie past it (otherwise the best ratio is at least the load seen, and the ratio steps up
only if GPUs were packed as far as it lets: to 80 % of it, or with no room for one more
trial). Each decision moves a ratio by at most `step`, so a bad estimate cannot swing
the cluster; only decisions that keep agreeing move it further, the step doubling every
two of them up to MOMENTUM steps. Pure: the caller feeds samples and applies the
ratios it returns (the simulator; the server through orchestrator/learned.py).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import astuple, dataclass, fields, replace
from typing import Any

from hypersack.core.bounds import is_number
from hypersack.orchestrator.fits import Fit, believed, fit, mixed_throughput, throughput

# The ratio chosen: the largest within this share of the most progress the fit
# predicts. Past a soft knee progress is nearly flat, and a hard-knee fit puts S early:
# on this machine's CPU (scripts/cpu_learned_ratio.py) the smallest such ratio settled
# at 1.9 from 1 (0.81 of the best fixed ratio's throughput), the largest climbed to 4
# (the best). In the simulator (scripts/sim_learned_ratio.py, an earlier round) the
# largest was within 5 % of the best fixed ratio in 11 of 16 and within 2 % of the
# configured in 14 of 16 (the smallest 12 and 13, the argmax 10 and 12).
KNEE = 0.01
# Where no saturation is seen, a step up must promise at least this share more progress:
# less lies within the fit's error, and packing tighter costs what the model lacks (a
# study whose every trial then starts at once runs its longest ones crowded to the end).
# Over 80 simulated runs (scripts/sim_learned_ratio.py --seeds 5), 2 % kept the learned
# ratio within 2 % of the configured one's makespan in 73 (66 with any gain) and its
# worst at 1.140 of the best fixed ratio (1.278); 1 %: 67, 3 %: 76 but 58 within 5 % of
# the best (64 and 63 with none and 2 %).
STEP_GAIN = 0.02
# With foresight (a host that simulates, `RatioLearner.weigh`): the ratio moves off the
# one in force only toward a candidate whose simulated study ends at least this share
# sooner (a simulated makespan is only as good as the fit behind it).
FORESIGHT_MARGIN = 0.01
# The candidates: from `low` to `high` by this, and a step either side of the ratio in
# force (a study's makespan is not smooth in the ratio: whole trials fit or do not).
FORESIGHT_GRID = 0.5
FORESIGHT_CACHE = 256  # simulated grids kept, by the fits and ratios they assumed
# An architecture's candidates are simulated again at most every this many decisions
# (unless a grid under the same fits and ratios is kept): the target holds in between
# (`foresight_every`; the server decides at most once a minute per architecture).
FORESIGHT_EVERY = 3
# Foresight acts once an architecture has this many times min_samples samples: a first
# fit's contention and saturation are hard to tell apart, and a simulation extrapolates
# them (in the simulator, SP3 under half the saturation stepped up on its first 20).
FORESIGHT_SAMPLES = 2
# A decision that moves the ratio the same way as the two before it takes twice the
# step, and twice again after two more, up to this many steps: 0.25, 0.25, 0.5, 0.5, 1,
# 1, ... A first move, one that turns back, and one after a hold are a single step, so
# one estimate still moves a ratio by a step; only decisions that keep agreeing move it
# further. Under doubled saturation SP3 wants 5-6 from 3, and a quarter a decision
# left it at 3.75-4.5. Over the 60 runs of scripts/sim_learned_ratio.py (SP1-SP3, four
# hidden models, seeds 0-4) it gave 52 within 5 % of the best fixed ratio against 51,
# the worst 1.078 against 1.110 (downward only: 51 and 1.110); on 36 runs of six
# held-out models 28 as before, the mean 1.012 against 1.013 (docs/simulator.md).
MOMENTUM = 4.0

# Given an architecture and candidate ratios for it (the others' in force), each
# candidate's simulated makespan of the work at hand under the learner's fits (math.inf:
# did not end); None: nothing to simulate now.
Weigh = Callable[[str, Sequence[float]], Mapping[float, float] | None]


class Weighing(Exception):
    """Raised by a host's `weigh` whose simulation runs elsewhere and is not in yet: the
    decision holds (no step), and the host decides again once it is in."""


class RatioLearner:
    """Per architecture: the samples (the latest `window`), and the ratio in force."""

    def __init__(self, configured: Mapping[str, float], *, low: float = 1.0,
                 high: float = 4.0, step: float = 0.25, min_samples: int = 40,
                 every: int = 40, window: int = 400, by_workload: bool = True,
                 foresight_every: int = FORESIGHT_EVERY) -> None:
        if not 0 < low <= high:
            raise ValueError("ratio bounds: 0 < low <= high")
        self.low, self.high, self.step = low, high, step
        self.min_samples, self.every = min_samples, every
        self.ratios: dict[str, float] = {a: min(high, max(low, r))
                                         for a, r in configured.items()}
        # Where each architecture started: the operator's prior, which work new to the
        # learner goes back to (`arriving`); a host adds an architecture it learns later.
        self.configured = dict(self.ratios)
        self.samples: dict[str, deque[tuple[float, int, float]]] = {}
        # Each sample's workload (its trial's model; "" unknown), in step with `samples`.
        self.labels: dict[str, deque[str]] = {}
        self.window = window
        self.by_workload = by_workload  # False: one fit of every sample, whatever runs
        self._new: dict[str, int] = {}
        self.fits: dict[str, Fit] = {}  # the latest, shown with the ratio
        # Per architecture, the latest fits of workloads with samples enough of their own.
        self.workload_fits: dict[str, dict[str, Fit]] = {}
        self.moves: dict[str, int] = {}
        # Per architecture, how many decisions in a row moved it the same way (negative:
        # down); none after a hold. The step grows with it (MOMENTUM).
        self.streaks: dict[str, int] = {}
        # Foresight: set by a host that can simulate the work at hand (the simulator,
        # the server's `ratio_foresight`); None: the target is the progress model's.
        self.weigh: Weigh | None = None
        self._weighed: dict[tuple[Any, ...], dict[float, float]] = {}
        self.foreseen: dict[str, Foreseen] = {}  # per architecture, the latest
        self._unweighed: dict[str, int] = {}  # decisions since its last simulation
        self._weighed_under: dict[str, tuple[Any, ...]] = {}  # the fits it assumed
        self.foresight_every = max(1, foresight_every)

    def observe(self, arch: str, load_pct: float, n: int, slowdown: float,
                workload: str = "", mix: Mapping[str, float] | None = None) -> float | None:
        """One sample; the architecture's new ratio when this one moved it."""
        if self.add(arch, load_pct, n, slowdown, workload) and self.due(arch):
            return self.decide(arch, mix)
        return None

    def add(self, arch: str, load_pct: float, n: int, slowdown: float,
            workload: str = "") -> bool:
        """Keep one sample (False: not a usable one, or an architecture not learned)."""
        if arch not in self.ratios or n < 1 or not (slowdown > 0 and math.isfinite(slowdown)) \
                or not (load_pct > 0 and math.isfinite(load_pct)):
            return False
        q = self.samples.setdefault(arch, deque(maxlen=self.window))
        labels = self.labels.setdefault(arch, deque(maxlen=self.window))  # in step with q
        q.append((float(load_pct), int(n), float(slowdown)))
        labels.append(workload[:200] if isinstance(workload, str) else "")
        self._new[arch] = self._new.get(arch, 0) + 1
        return True

    def due(self, arch: str) -> bool:
        """Whether `every` samples came since the architecture's last decision."""
        return self._new.get(arch, 0) >= self.every

    def reconsider(self, arch: str, mix: Mapping[str, float] | None = None) -> float | None:
        """A decision without new samples, by foresight alone, for new work at hand (a
        study arrived, or the one simulated changed): its simulation runs afresh. None
        where nothing moved, or foresight cannot act on the architecture yet."""
        if not self.can_foresee(arch):
            return None
        self._weighed_under.pop(arch, None)
        return self.decide(arch, mix, foresight_only=True)

    def can_foresee(self, arch: str) -> bool:
        """Whether foresight may set the architecture's target (a host simulates, and
        FORESIGHT_SAMPLES x min_samples samples are in)."""
        return self.weigh is not None and \
            len(self.samples.get(arch, ())) >= FORESIGHT_SAMPLES * self.min_samples

    def forget_foresight(self) -> None:
        """The work at hand changed: the grids simulated for the old work no longer hold
        (the host's `weigh` simulates what is at hand; the cache does not know what)."""
        self._weighed.clear()
        self._weighed_under.clear()

    @staticmethod
    def _counted(workloads: Mapping[str, float]) -> dict[str, float]:
        """The workloads named, each with a positive finite count of trials."""
        return {w: float(c) for w, c in workloads.items()
                if isinstance(w, str) and w and is_number(c) and 0 < float(c) < math.inf}

    def novel(self, arch: str, workloads: Mapping[str, float]) -> bool:
        """Whether most of `workloads` (each counted by its trials) have fewer than
        `min_samples` samples of their own on the architecture in the window."""
        weights = self._counted(workloads)
        total = sum(weights.values())
        if total <= 0:
            return False
        seen: dict[str, int] = {}
        for label in self.labels.get(arch, ()):
            seen[label] = seen.get(label, 0) + 1
        new = sum(c for w, c in weights.items() if seen.get(w[:200], 0) < self.min_samples)
        return new > 0.5 * total

    def arriving(self, workloads: Mapping[str, float], pending: float,
                 running: Mapping[str, float], own: Collection[str] = ()
                 ) -> dict[str, float]:
        """A study is about to be placed (`workloads`: its trials by workload; `pending`:
        the trials all studies have waiting; `running`: per architecture, the trials
        running there; `own`: the architectures it packs at its own ratio). Where it
        brings more trials than run on an architecture and wait, does not set its own
        ratio there, and is mostly of workloads new to the learner there, what the
        learner knows there is of other work: that architecture's ratio goes back to the
        configured one (the operator's prior) at once, and the new workloads' own samples
        move it from there. A small study beside a busy cluster's work moves nothing.
        The architectures moved, to their new ratio; none with one fit of every sample
        (no workloads told apart)."""
        moved: dict[str, float] = {}
        if not self.by_workload:
            return moved
        size = sum(self._counted(workloads).values())
        for arch in sorted(self.ratios):
            configured = self.configured.get(arch)
            if configured is None or abs(self.ratios[arch] - configured) < 1e-9 or \
                    arch in own or size <= pending + running.get(arch, 0.0) or \
                    not self.novel(arch, workloads):
                continue
            self.ratios[arch] = moved[arch] = configured
            self.moves[arch] = self.moves.get(arch, 0) + 1
            self.streaks.pop(arch, None)
            self._weighed_under.pop(arch, None)
        return moved

    def decide(self, arch: str, mix: Mapping[str, float] | None = None, *,
               foresight_only: bool = False) -> float | None:
        """Fit the architecture's samples and step its ratio toward the best; the new
        ratio when it moved. `mix`: the trials running on the architecture now, counted
        by workload (the per-workload fits are weighed by it; None: the pooled fit).
        `foresight_only`: no step unless foresight sets the target (the progress model's
        target comes from the samples alone, and no new ones came)."""
        if not foresight_only:
            self._new[arch] = 0
        q = self.samples.get(arch, ())
        if len(q) < self.min_samples:
            return None
        f = fit(list(q))
        if f is None:
            return None
        self.fits[arch] = f
        parts = self._parts(arch, f, mix) if self.by_workload else [(1.0, f)]
        if parts is None:
            return None  # most trials running are of workloads with too few samples
        current = self.ratios[arch]
        packed = f.max_load_pct >= 0.8 * 100.0 * current or \
            f.max_load_pct + f.mean_share_pct > 100.0 * current
        saturated = any(believed(p) for _, p in parts)
        progress = self._progress_target(f, parts, current, packed, saturated)
        try:
            target = self._foreseen_target(arch, current) if self.can_foresee(arch) else None
        except Weighing:
            return None  # held: the host decides again once its simulation is in
        if target is not None:
            # The simulated study's choice; but up past loads never seen only where the
            # progress model would go up too (GPUs packed as far as the ratio lets and
            # a step promising STEP_GAIN more, or a saturation point known past it):
            # there the simulation extrapolates the fit.
            if target > current and not (progress is not None and progress > current):
                target = current
        elif foresight_only or progress is None:
            return None  # nothing foreseen; not packed near the ratio: nothing says where
        else:
            target = progress
        if abs(target - current) < 1e-9:
            self.streaks.pop(arch, None)  # a hold: the next move is a single step
            return None
        way = 1 if target > current else -1
        streak = self.streaks.get(arch, 0)
        self.streaks[arch] = streak = streak + way if streak * way > 0 else way
        step = self.step * min(MOMENTUM, 2.0 ** ((abs(streak) - 1) // 2))
        new = min(self.high, max(self.low, current + max(-step, min(step, target - current))))
        if abs(new - current) < 1e-9:
            return None
        self.ratios[arch] = new
        self.moves[arch] = self.moves.get(arch, 0) + 1
        return new

    def _progress_target(self, f: Fit, parts: list[tuple[float, Fit]], current: float,
                         packed: bool, saturated: bool) -> float | None:
        """The progress model's target: the largest ratio within KNEE of the most
        progress the fits predict where saturation is known; a step up where GPUs are
        packed as far as the ratio lets and it promises STEP_GAIN more; None where
        neither (not packed near the ratio: nothing says where saturation lies)."""
        if saturated:
            grid = [self.low + i * 0.05 for i in range(round((self.high - self.low) / 0.05) + 1)]
            if len(parts) == 1:  # one fit: all samples', or the one workload running's
                progress = [throughput(r, parts[0][1]) for r in grid]
            else:
                progress = [mixed_throughput(r, parts) for r in grid]
            most = max(progress)
            return max(r for r, p in zip(grid, progress, strict=True) if p >= (1 - KNEE) * most)
        if packed:
            # Packed as far as the ratio lets (to 80 % of it, or with no room for one more
            # trial) and still short of saturation, which lies beyond what was seen: more
            # pays unless each client costs as much as it adds (c >= 1).
            unsaturated = replace(f, saturation_pct=math.inf)
            return current + self.step if throughput(current + self.step, unsaturated) > \
                (1 + STEP_GAIN) * throughput(current, unsaturated) else current
        return None

    def _foreseen_target(self, arch: str, current: float) -> float | None:
        """The candidate ratio (FORESIGHT_GRID's and a step either side) whose simulated study
        ends first, unless the one in force ends within FORESIGHT_MARGIN of it; None
        where nothing was simulated or no candidate ended. A grid already simulated
        under the same fits (rounded) and the same other ratios is not simulated again."""
        weigh = self.weigh
        if weigh is None:
            return None
        count = round((self.high - self.low) / FORESIGHT_GRID)
        # The ratio in force and a step either side first: if the simulations run out of
        # time (sim/foresight.RATIO_BUDGET_S on the server), those are the ones simulated.
        near = [round(min(self.high, max(self.low, current + d)), 6)
                for d in (0.0, -self.step, self.step)]
        grid = list(dict.fromkeys(near + [round(min(self.high, self.low + i * FORESIGHT_GRID), 6)
                                          for i in range(count + 1)]))
        fitted = (tuple(sorted((a, _rounded(f)) for a, f in self.fits.items())),
                  tuple(sorted((a, w, _rounded(g)) for a, fs in self.workload_fits.items()
                               for w, g in fs.items())))
        key = (arch, tuple(grid), tuple(sorted((a, round(r, 6)) for a, r in self.ratios.items()
                                               if a != arch)), fitted)
        spans = self._weighed.get(key)
        last = self.foreseen.get(arch)
        self._unweighed[arch] = self._unweighed.get(arch, 0) + 1
        if spans is None and last is not None and fitted == self._weighed_under.get(arch) \
                and self._unweighed[arch] < self.foresight_every:
            # Simulated again every foresight_every-th decision, or once the fits move.
            return last.target
        if spans is None:
            self._unweighed[arch] = 0
            self._weighed_under[arch] = fitted
            try:
                got = weigh(arch, grid)
            except Weighing:
                self._weighed_under.pop(arch, None)  # weighed when the answer is in
                raise
            if not got:
                return None
            spans = {round(float(r), 6): float(m) for r, m in got.items()
                     if is_number(r) and is_number(m) and m > 0}
            if len(self._weighed) >= FORESIGHT_CACHE:
                self._weighed.pop(next(iter(self._weighed)))
            self._weighed[key] = spans
        ended = {r: m for r, m in spans.items() if math.isfinite(m)}
        if not ended:
            return None
        best = min(ended, key=lambda r: (ended[r], abs(r - current)))
        now = spans.get(round(current, 6), math.inf)
        target = best if ended[best] < (1 - FORESIGHT_MARGIN) * now else current
        self.foreseen[arch] = Foreseen(target, ended[best], best, now, len(spans))
        return target

    def _parts(self, arch: str, pooled: Fit, mix: Mapping[str, float] | None
               ) -> list[tuple[float, Fit]] | None:
        """(weight, fit) for the trials running now: each workload with `min_samples`
        samples in the window by its own fit; the others together by the fit of their
        samples if they have that many, else by the fit of every sample, unless they are
        most of what runs: then None (hold; what runs is mostly new to the learner). One
        part, the fit of every sample, without a mix or labelled samples."""
        by: dict[str, list[tuple[float, int, float]]] = {}
        for sample, label in zip(self.samples.get(arch, ()), self.labels.get(arch, ()),
                                 strict=True):  # kept in step by add and load
            if label:
                by.setdefault(label, []).append(sample)
        own: dict[str, Fit] = {}
        for label, xs in by.items():
            if len(xs) >= self.min_samples:
                g = fit(xs)
                if g is not None:
                    own[label] = g
        self.workload_fits[arch] = own
        weights = {w: float(c) for w, c in (mix or {}).items()
                   if isinstance(w, str) and is_number(c) and 0 < float(c) < math.inf}
        if not by or not weights:
            return [(1.0, pooled)]
        parts = [(c, own[w]) for w, c in weights.items() if w in own]
        rest = {w: c for w, c in weights.items() if w not in own}
        if rest:
            xs = [x for w in rest for x in by.get(w, ())]
            g = fit(xs) if len(xs) >= self.min_samples else None
            share = sum(rest.values()) / sum(weights.values())
            if g is None and share > 0.5:
                return None
            parts.append((sum(rest.values()), g if g is not None else pooled))
        return parts

    def state(self) -> dict[str, Any]:
        """What a restarted server needs to decide as this one would (JSON)."""
        return {"ratios": dict(self.ratios), "moves": dict(self.moves),
                "new": dict(self._new), "streaks": dict(self.streaks),
                "fits": {a: list(astuple(f)) for a, f in self.fits.items()},
                "samples": {a: [list(x) for x in q] for a, q in self.samples.items()},
                "labels": {a: list(q) for a, q in self.labels.items()},
                "workload_fits": {a: {w: list(astuple(f)) for w, f in fs.items()}
                                  for a, fs in self.workload_fits.items()}}

    def load(self, state: Mapping[str, Any], configured: Mapping[str, float]) -> None:
        """Take back a saved state, for the architectures whose configured ratio is still
        `configured`'s (one whose configuration changed starts afresh from it). What does
        not parse is left out."""
        saved_from = state.get("configured") or {}
        for arch, ratio in (state.get("ratios") or {}).items():
            if arch not in self.ratios or not is_number(ratio) or \
                    not is_number(saved_from.get(arch)) or \
                    abs(float(saved_from[arch]) - float(configured.get(arch, -1.0))) > 1e-9:
                continue
            self.ratios[arch] = min(self.high, max(self.low, float(ratio)))
            moves, new = (state.get("moves") or {}).get(arch), (state.get("new") or {}).get(arch)
            self.moves[arch] = moves if type(moves) is int and moves >= 0 else 0  # not a bool
            self._new[arch] = new if type(new) is int and new >= 0 else 0
            streak = (state.get("streaks") or {}).get(arch)
            if type(streak) is int and streak and abs(streak) <= 1_000_000:
                self.streaks[arch] = streak
            q: deque[tuple[float, int, float]] = deque(maxlen=self.window)
            labels: deque[str] = deque(maxlen=self.window)
            kept = (state.get("samples") or {}).get(arch)
            kept = kept[-self.window:] if isinstance(kept, list) else []
            said = (state.get("labels") or {}).get(arch)
            # A sample's label at the same place from the end (none: a state saved before
            # labels were kept, or one whose lengths disagree).
            said = said[-len(kept):] if isinstance(said, list) and len(said) == \
                len((state.get("samples") or {}).get(arch) or ()) and kept else []
            for k, x in enumerate(kept):
                if isinstance(x, list) and len(x) == 3 and all(is_number(v) for v in x):
                    q.append((float(x[0]), int(x[1]), float(x[2])))
                    label = said[k] if said else ""
                    labels.append(label[:200] if isinstance(label, str) else "")
            if q:
                self.samples[arch] = q
                self.labels[arch] = labels
            f = (state.get("fits") or {}).get(arch)
            if isinstance(f, list) and len(f) == len(fields(Fit)) and all(map(is_number, f)):
                self.fits[arch] = Fit(*f)
            own = (state.get("workload_fits") or {}).get(arch) if self.by_workload else None
            self.workload_fits[arch] = {
                w[:200]: Fit(*f) for w, f in (own.items() if isinstance(own, dict) else ())
                if isinstance(w, str) and w and isinstance(f, list)
                and len(f) == len(fields(Fit)) and all(map(is_number, f))}


@dataclass(frozen=True)
class Foreseen:
    """An architecture's latest foresight: the target it set, and the simulated ends
    behind it (the best candidate's and the ratio in force's)."""

    target: float
    best_s: float
    best_ratio: float
    current_s: float
    candidates: int

    def describe(self) -> str:
        now = f"{self.current_s:.0f} s" if math.isfinite(self.current_s) else "no end"
        return (f"foresight: of {self.candidates} ratios simulated, {self.best_ratio:g} ends "
                f"the work at hand soonest ({self.best_s:.0f} s; {now} at the ratio then in "
                f"force), target {self.target:g}")


def _rounded(f: Fit) -> tuple[Any, ...]:
    """A fit as far as a simulated grid depends on it: a grid is simulated again only
    when the fit moves past these steps."""
    return (round(f.contention / 0.05), round(f.saturation_pct / 25), f.queued, believed(f),
            round(f.mean_share_pct / 10))
