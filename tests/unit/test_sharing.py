"""The sharing level learned from observed slowdown (issue 38, 1-2, the learner and the
simulator; the server's wiring: test_learned_ratio.py): the fit recovers the
interference model (with the share of an iteration that queues), the ratio moves only
on enough samples and by at most a step, toward saturation when samples lie past it
and up when GPUs are packed and unsaturated, within bounds; a study's own ratio still
wins; and in the simulator a hidden model with half the
saturation makes it pack less and finish sooner than the configured ratio."""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from hypersack.orchestrator.fits import fit, throughput
from hypersack.orchestrator.sharing import (
    FORESIGHT_EVERY,
    FORESIGHT_SAMPLES,
    MOMENTUM,
    STEP_GAIN,
    RatioLearner,
)


def _samples(c: float, sat: float, k: int = 300, share: float = 50.0, most: int = 10,
             seed: int = 0, queued: float = 1.0) -> list[tuple[float, int, float]]:
    rng = random.Random(seed)
    out = []
    for _ in range(k):
        n = rng.randint(1, most)
        load = sum(rng.uniform(0.6 * share, 1.4 * share) for _ in range(n))
        q = 1 - queued + queued * max(1.0, load / sat)
        out.append((load, n, (1 + c * (n - 1)) * q * rng.uniform(0.97, 1.03)))
    return out


@pytest.mark.parametrize("c,sat", [(0.1, 270.0), (0.3, 135.0), (0.5, 225.0), (0.0, 180.0)])
def test_the_fit_recovers_the_interference_model(c: float, sat: float) -> None:
    f = fit(_samples(c, sat))
    assert f is not None
    assert f.contention == pytest.approx(c, abs=0.03)
    assert f.saturation_pct == pytest.approx(sat, rel=0.05)
    assert f.past_saturation > 0


def test_a_workload_slowed_only_in_part_is_packed_past_saturation() -> None:
    """Trials that queue for half of each iteration past saturation (the other half
    waits on I/O) still gain from more packing past it, less and less: the ratio goes
    past the knee a whole queue would stop at, within 1 % of the most progress."""
    f = fit(_samples(0.01, 200.0, queued=0.5))
    assert f is not None and f.queued == 0.5
    assert f.saturation_pct == pytest.approx(200.0, rel=0.05)
    whole = fit(_samples(0.01, 200.0))
    assert whole is not None and whole.queued == 1.0
    learner = RatioLearner({"A100": 2.0}, high=6.0, step=10.0)
    assert _feed(learner, _samples(0.01, 200.0, k=40, queued=0.5, seed=1)) != []
    part = learner.ratios["A100"]
    learner = RatioLearner({"A100": 2.0}, high=6.0, step=10.0)
    _feed(learner, _samples(0.01, 200.0, k=40, seed=1))
    assert learner.ratios["A100"] <= 2.5 < 4.0 <= part  # one trial past the knee, at most
    assert throughput(part, f) >= 0.99 * max(throughput(r / 10, f) for r in range(10, 61))


def test_unseen_saturation_is_only_a_lower_bound() -> None:
    f = fit(_samples(0.3, 5000.0, most=4))
    assert f is not None and f.past_saturation == 0
    assert f.saturation_pct >= f.max_load_pct
    assert fit([]) is None and fit([(100.0, 2, math.nan)]) is None


def _feed(learner: RatioLearner, samples: list[tuple[float, int, float]]) -> list[float]:
    moves = []
    for load, n, s in samples:
        moved = learner.observe("A100", load, n, s)
        if moved is not None:
            moves.append(moved)
    return moves


def test_the_ratio_steps_toward_saturation_by_at_most_a_step() -> None:
    learner = RatioLearner({"A100": 3.0}, step=0.25, min_samples=40, every=20)
    assert _feed(learner, _samples(0.3, 135.0, k=39)) == []  # too few to act on
    moves = _feed(learner, _samples(0.3, 135.0, k=400, seed=1))
    # A step, growing only while the decisions agree (MOMENTUM): 0.25, 0.25, 0.5, ...
    steps = [abs(b - a) for a, b in zip([3.0, *moves[:-1]], moves, strict=True)]
    assert steps and steps[0] <= 0.25 + 1e-9
    assert all(s <= 0.25 * min(MOMENTUM, 2 ** (k // 2)) + 1e-9 for k, s in enumerate(steps))
    assert learner.ratios["A100"] == pytest.approx(1.35, abs=0.1)  # S / 100
    fitted = learner.fits["A100"]
    best = max((1 + i / 20 for i in range(61)), key=lambda r: throughput(r, fitted))
    assert best == pytest.approx(fitted.saturation_pct / 100, abs=0.05)


class _Scripted(RatioLearner):
    """A learner whose progress model's target is given, decision by decision."""

    def __init__(self, targets: list[float], **kw: Any) -> None:
        super().__init__({"A100": 3.0}, high=8.0, min_samples=10, every=10,
                         by_workload=False, **kw)
        self.targets = targets

    def _progress_target(self, *args: Any) -> float | None:
        return self.targets.pop(0)


def test_the_step_grows_while_decisions_agree_and_starts_over_when_they_do_not() -> None:
    """A ratio far from its target gets there in fewer decisions (SP3 under doubled
    saturation wants 5-6 from 3), but only on decisions that agree: the first move, one
    that turns back, and one after a hold are a single step, and a step never passes
    the target or the bounds."""
    learner = _Scripted([8.0] * 6 + [3.0, 8.0, 8.0, 8.0, 8.0, 8.0])
    samples = _samples(0.1, 5000.0, k=120, most=4)
    ratios = [learner.ratios["A100"]]
    for load, n, s in samples:  # a decision every 10: twelve, one per target
        learner.observe("A100", load, n, s)
        if ratios[-1] != learner.ratios["A100"]:
            ratios.append(learner.ratios["A100"])
    steps = [round(b - a, 6) for a, b in itertools.pairwise(ratios)]
    assert steps[:6] == [0.25, 0.25, 0.5, 0.5, 1.0, 1.0]  # 3 -> 6.5
    assert steps[6] == -0.25  # turned back: one step
    assert steps[7:10] == [0.25, 0.25, 0.5]  # up again, from one step
    assert max(learner.ratios.values()) <= 8.0
    # A hold (the target met) starts the count over, and the state keeps the count.
    held = _Scripted([4.0, 4.0, 4.0, 4.0, 8.0])
    for load, n, s in samples[:50]:
        held.observe("A100", load, n, s)
    assert held.ratios["A100"] == 4.25  # 3.25, 3.5, 4 (capped at the target), hold, 4.25
    again = RatioLearner({"A100": 3.0}, high=8.0)
    again.load({**held.state(), "configured": {"A100": 3.0}}, {"A100": 3.0})
    assert again.streaks == held.streaks == {"A100": 1}


def test_packed_and_unsaturated_it_explores_up_to_its_bound() -> None:
    learner = RatioLearner({"A100": 2.0}, high=3.0, min_samples=20, every=10)
    # Loads up to the ratio's 200 %, saturation far beyond: more pays.
    samples = [(s[0] * 200 / 260, s[1], s[2]) for s in _samples(0.2, 5000.0, most=4)]
    _feed(learner, samples)
    assert 2.0 < learner.ratios["A100"] <= 3.0
    # Not packed near the ratio: nothing says where saturation lies; no move.
    idle = RatioLearner({"A100": 3.0}, min_samples=20, every=10)
    assert _feed(idle, [(50.0, 1, 1.0)] * 100) == []
    # Each client costing what it adds (c >= 1): packing more never pays.
    costly = RatioLearner({"A100": 2.0}, min_samples=20, every=10)
    assert _feed(costly, [(s[0] * 200 / 260, s[1], s[2])
                          for s in _samples(1.2, 5000.0, most=4)]) == []


def test_a_step_up_must_promise_more_than_the_fit_s_error() -> None:
    """Unsaturated, the ratio climbs while a step promises at least STEP_GAIN more
    progress, and stops where the fitted contention flattens the gain below it (a step
    that gains less is within the fit's error, and crowds a study's longest trials)."""
    samples = [(s[0] * 200 / 260, s[1], s[2]) for s in _samples(0.3, 5000.0, most=4)]
    seen = fit(samples)
    assert seen is not None and seen.past_saturation == 0
    f = replace(seen, saturation_pct=math.inf)  # only a lower bound: taken as none
    gain = [throughput(r + 0.25, f) / throughput(r, f) - 1 for r in (2.0, 4.0, 5.75)]
    assert gain[0] > STEP_GAIN > gain[2]  # the gain of a step falls as the GPU fills
    learner = RatioLearner({"A100": 2.0}, high=6.0, min_samples=20, every=10)
    rng = random.Random(2)
    for _ in range(40):  # trials of 50 %, packed to the ratio in force each time
        most = int(100 * learner.ratios["A100"] / 50)
        _feed(learner, [(50.0 * n, n, (1 + 0.3 * (n - 1)) * rng.uniform(0.98, 1.02))
                        for n in (rng.randint(1, most) for _ in range(19))] +
              [(50.0 * most, most, 1 + 0.3 * (most - 1))])
    stop = learner.ratios["A100"]
    f = replace(learner.fits["A100"], saturation_pct=math.inf)
    assert 2.0 < stop < 6.0
    assert throughput(stop + 0.25, f) <= (1 + STEP_GAIN) * throughput(stop, f) * 1.01
    assert throughput(stop, f) > (1 + STEP_GAIN) * throughput(stop - 0.25, f) * 0.99


def test_bad_samples_and_unknown_architectures_are_ignored() -> None:
    learner = RatioLearner({"A100": 3.0}, min_samples=1, every=1)
    for bad in [(100.0, 0, 1.0), (100.0, 2, math.nan), (100.0, 2, -1.0), (100.0, 2, math.inf)]:
        assert learner.observe("A100", *bad) is None
    assert learner.observe("V100", 100.0, 2, 1.5) is None
    assert learner.samples.get("A100", []) == [] and "V100" not in learner.ratios
    with pytest.raises(ValueError):
        RatioLearner({"A100": 3.0}, low=2.0, high=1.0)


def test_a_learned_ratio_applies_and_a_study_s_own_still_wins() -> None:
    from hypersack.core.clock import ManualClock
    from hypersack.orchestrator import Orchestrator
    from hypersack.store import MemoryStore

    orch = Orchestrator(MemoryStore(), ManualClock(0.0))
    orch.s.set_ratios({"A100": 1.5})
    assert orch.s.config.ratio("A100", {}) == 1.5
    assert orch.s.config.ratio("H100", {}) == 2.5  # untouched
    assert orch.s.config.ratio("A100", {"A100": 2.0}) == 2.0


def test_in_the_simulator_half_the_saturation_is_learned_and_pays() -> None:
    from hypersack.core.cluster import parse_shorthand
    from hypersack.grid.space import load_space
    from hypersack.orchestrator import OrchestratorConfig
    from hypersack.orchestrator.config import DEFAULT_RATIOS
    from hypersack.sampler.profiles import load_profiles
    from hypersack.sim.interference import Interference
    from hypersack.sim.simulator import Simulation

    examples = Path(__file__).resolve().parents[2] / "examples"
    hidden = Interference(saturation_pct={"A100": 135.0, "H100": 112.5})
    truth = load_profiles(examples / "profiles-estimates.yaml")
    space = load_space(str(examples / "sp2.yaml"))

    def run(ratios: dict[str, float], learner: RatioLearner | None) -> float:
        return Simulation(space, parse_shorthand("1x4xA100-80GB@88,1x2xH100-80GB@96"),
                          truth, config=OrchestratorConfig(oversubscription=ratios,
                                                           fusion=False, policy="wfd"),
                          interference=hidden, learner=learner,
                          sample_every_s=2.0).run().makespan_s

    configured = run(dict(DEFAULT_RATIOS), None)
    learner = RatioLearner(DEFAULT_RATIOS, high=6.0, every=10, min_samples=20,
                           foresight_every=10)
    run(dict(DEFAULT_RATIOS), learner)
    assert learner.ratios["A100"] < 2.0 and learner.ratios["H100"] < 2.0
    warm = run(dict(learner.ratios), learner)
    assert warm < 0.8 * configured
    # The simulator gave the learner its foresight: SP2 simulated under candidate ratios
    # with the fits (learn_foresight, on by default).
    assert set(learner.foreseen) == {"A100", "H100"}
    assert all(math.isfinite(f.best_s) and f.candidates >= 7 for f in learner.foreseen.values())


def test_in_the_simulator_a_study_that_arrives_is_reconsidered_before_it_runs() -> None:
    from hypersack.core.cluster import parse_shorthand
    from hypersack.grid.space import load_space
    from hypersack.orchestrator import OrchestratorConfig
    from hypersack.orchestrator.config import DEFAULT_RATIOS
    from hypersack.sampler.profiles import load_profiles
    from hypersack.sim.simulator import Simulation

    class Foreseeing(Simulation):
        def _weigh(self, arch: str, candidates: Any) -> Any:  # the study ends first at 1
            return {r: 100.0 + 10.0 * abs(r - 1.0) for r in candidates}

    examples = Path(__file__).resolve().parents[2] / "examples"
    learner = RatioLearner(DEFAULT_RATIOS, high=6.0, every=10, min_samples=20)
    for load, n, slow in _samples(0.2, 5000.0, most=4, k=FORESIGHT_SAMPLES * 20):
        learner.add("A100", load, n, slow)  # learned before: H100 has no samples yet
    sim = Foreseeing(load_space(str(examples / "sp2.yaml")),
                     parse_shorthand("1x4xA100-80GB@88,1x2xH100-80GB@96"),
                     load_profiles(examples / "profiles-estimates.yaml"),
                     config=OrchestratorConfig(oversubscription=dict(DEFAULT_RATIOS),
                                               fusion=False, policy="wfd"),
                     learner=learner, sample_every_s=2.0)
    sim.run()
    # At the study's arrival (time 0), A100 a step toward 1.
    assert sim.ratio_moves[0] == (0.0, "A100", DEFAULT_RATIOS["A100"] - 0.25)
    assert all(at > 0 for at, arch, _ in sim.ratio_moves if arch == "H100")


def test_work_new_to_the_learner_goes_back_to_the_configured_ratio() -> None:
    """A study about to be placed, larger than what runs and waits on an architecture
    and mostly of workloads with fewer than min_samples samples of their own: the ratio
    goes back to the configured one at once (what was learned is of other work). Not for
    known work, a study smaller than the work beside it, or one fit of every sample."""
    for by_workload in (True, False):
        learner = RatioLearner({"A100": 3.0}, high=6.0, min_samples=20,
                               by_workload=by_workload)
        for load, n, slow in _samples(0.1, 5000.0, k=40):
            learner.add("A100", load, n, slow, "cnn")
        for load, n, slow in _samples(0.1, 5000.0, k=19):
            learner.add("A100", load, n, slow, "vit")  # one short of its own fit
        learner.ratios["A100"] = 4.5  # as learned from the CNN samples
        assert learner.arriving({"vit": 10.0}, 12, {"A100": 8.0}) == {}  # beside more work
        assert learner.arriving({"vit": 10.0, "cnn": 30.0}, 0, {}) == {}
        moves = learner.moves.get("A100", 0)
        assert learner.arriving({"vit": 30.0}, 0, {}, own={"A100"}) == {}  # its own ratio
        got = learner.arriving({"vit": 30.0, "bert": 1.0, "cnn": 10.0}, 10, {"A100": 30.0})
        if not by_workload:
            assert got == {} and learner.ratios["A100"] == 4.5
            continue
        assert got == {"A100": 3.0} and learner.ratios["A100"] == 3.0
        assert learner.moves["A100"] == moves + 1
        assert learner.arriving({"vit": 30.0}, 0, {}) == {}  # at the configured already
        assert not learner.novel("A100", {"cnn": 5.0}) and learner.novel("A100", {"x": 1.0})
        assert not learner.novel("A100", {"vit": math.nan, "": 3.0})


def test_in_the_simulator_new_work_starts_at_the_configured_ratio() -> None:
    from hypersack.core.cluster import parse_shorthand
    from hypersack.grid.space import load_space
    from hypersack.orchestrator import OrchestratorConfig
    from hypersack.orchestrator.config import DEFAULT_RATIOS
    from hypersack.sampler.profiles import load_profiles
    from hypersack.sim.simulator import Simulation

    examples = Path(__file__).resolve().parents[2] / "examples"
    firsts = {}
    for labels in (["resnet18"], ["bert_tiny", "pythia_14m", "pythia_31m"]):
        learner = RatioLearner(DEFAULT_RATIOS, high=6.0, every=10, min_samples=20)
        for label in labels:
            for load, n, slow in _samples(0.1, 5000.0, k=30):
                learner.add("A100", load, n, slow, label)
        learner.ratios["A100"] = 5.0  # learned on those workloads
        sim = Simulation(load_space(str(examples / "sp2.yaml")),
                         parse_shorthand("1x4xA100-80GB@88,1x2xH100-80GB@96"),
                         load_profiles(examples / "profiles-estimates.yaml"),
                         config=OrchestratorConfig(oversubscription=dict(learner.ratios),
                                                   fusion=False, policy="wfd",
                                                   learn_foresight=False),
                         learner=learner, sample_every_s=2.0)
        sim.run()
        firsts[labels[0]] = sim.ratio_moves
    # SP2's language models after a CNN: A100 back to 3 at the submission (time 0).
    assert firsts["resnet18"][0] == (0.0, "A100", DEFAULT_RATIOS["A100"])
    # After SP2's own workloads: it steps on from 5, a quarter at a time.
    assert firsts["bert_tiny"][0][2] in (4.75, 5.25)


def test_a_saved_state_that_does_not_parse_is_left_out() -> None:
    """What the store gave back is checked as a peer's input is: numbers past a float's
    range, bools, NaN and wrong shapes are left out, not raised on."""
    learner = RatioLearner({"A100": 3.0, "H100": 2.5})
    learner.load({"configured": {"A100": 3.0, "H100": 2.5},
                  "ratios": {"A100": 10**400, "H100": 2.0},
                  "moves": {"H100": True}, "streaks": {"H100": True, "A100": 10**400},
                  "samples": {"H100": [[1e400, 2, 1.0],
                                                                [100.0, 2, math.nan],
                                                                [100.0, 2, 1.1], "x"]},
                  "fits": {"H100": [1.0, 2.0]}}, {"A100": 3.0, "H100": 2.5})
    assert learner.ratios == {"A100": 3.0, "H100": 2.0}
    assert list(learner.samples["H100"]) == [(100.0, 2, 1.1)]
    assert learner.moves["H100"] == 0 and "H100" not in learner.fits
    assert learner.streaks == {}  # a bool, and a count past any run of decisions
    # Labels and per-workload fits: kept where they line up and parse, else left out.
    learner = RatioLearner({"H100": 2.5})
    learner.load({"configured": {"H100": 2.5}, "ratios": {"H100": 2.0},
                  "samples": {"H100": [[1e400, 2, 1.0], [100.0, 2, 1.1], [120.0, 3, 1.2]]},
                  "labels": {"H100": ["a", 7, "x" * 500]},
                  "workload_fits": {"H100": {"vit": [1.0, 2.0], "": [0.1] * 7,
                                             "cnn": [0.1, 200.0, 40, 3, 300.0, 30.0, 1.0],
                                             "bad": [math.nan] * 7}}},
                 {"H100": 2.5})
    assert list(learner.labels["H100"]) == ["", "x" * 200]
    assert set(learner.workload_fits["H100"]) == {"cnn"}
    short = RatioLearner({"H100": 2.5})
    short.load({"configured": {"H100": 2.5}, "ratios": {"H100": 2.0},
                "samples": {"H100": [[100.0, 2, 1.1], [120.0, 3, 1.2]]},
                "labels": {"H100": ["only one"]}}, {"H100": 2.5})
    assert list(short.labels["H100"]) == ["", ""]  # lengths disagree: none trusted


# Two workloads on one architecture: "cnn"'s kernels queue for a fifth of an iteration
# past saturation, "vit"'s for all of it (contention 0.1, saturation 150 %, 30 % each).
TWO = {"cnn": 0.2, "vit": 1.0}


def _slow(load: float, n: int, queued: float) -> float:
    return (1 + 0.1 * (n - 1)) * (1 - queued + queued * max(1.0, load / 150.0))


def _progress(ratio: float, mix: dict[str, float]) -> float:
    """The hidden model's progress of a GPU packed to `ratio` with this mix."""
    n = max(1.0, 100 * ratio / 30.0)
    total = sum(mix.values())
    return sum(c / total * n / _slow(100 * ratio, n, TWO[w]) for w, c in mix.items())


def _learned(mix: dict[str, float] | None, decisions: int = 20) -> float:
    """A learner fed a window of both workloads half and half, then deciding with `mix`
    running (None: one fit of every sample)."""
    learner = RatioLearner({"A100": 2.5}, low=1.0, high=4.0, min_samples=40, every=1,
                           window=800)
    rng = random.Random(1)
    for _ in range(400):
        ratio = rng.uniform(1.0, 4.0)
        n = max(1, round(100 * ratio / 30))
        for w, queued in TWO.items():
            slow = _slow(100 * ratio, n, queued) * rng.uniform(0.98, 1.02)
            learner.add("A100", 100 * ratio, n, slow, w)
    for _ in range(decisions):
        learner.decide("A100", mix)
    return learner.ratios["A100"]


@pytest.mark.parametrize("mix", [{"vit": 10.0}, {"vit": 8.0, "cnn": 2.0}, {"cnn": 8.0, "vit": 2.0},
                                 {"cnn": 10.0}])
def test_per_workload_fits_follow_the_mix_running_now(mix: dict[str, float]) -> None:
    """The window holds both workloads half and half; what runs now is another mix. One
    fit of every sample packs for the past mix; a fit per workload, weighed by what runs
    now, packs for it: within 1 % of the best progress, where the pooled fit loses
    3-16 % (the module's docstring has the numbers)."""
    grid = [1.0 + 0.05 * i for i in range(61)]
    best = max(_progress(r, mix) for r in grid)
    by_workload = _learned(mix)
    pooled = _learned(None)
    assert _progress(by_workload, mix) >= 0.99 * best
    assert _progress(pooled, mix) <= 0.97 * best
    # The workloads' own fits are what the view shows.
    learner = RatioLearner({"A100": 2.5}, min_samples=40, every=1)
    for _ in range(60):
        learner.add("A100", 300.0, 10, _slow(300.0, 10, 1.0), "vit")
        learner.add("A100", 120.0, 4, _slow(120.0, 4, 1.0), "vit")
    learner.decide("A100", {"vit": 1.0})
    assert set(learner.workload_fits["A100"]) == {"vit"}


def test_workloads_new_to_the_learner_hold_the_ratio_until_they_have_samples() -> None:
    """What runs now is mostly a workload with fewer than min_samples samples: the
    ratio holds (its own estimate would be a guess from other workloads'); as a minority
    it is weighed by the fit of every sample; unlabelled samples (an older server's)
    never make a fit of their own, and without a mix the fit of every sample decides."""
    def fed() -> RatioLearner:
        learner = RatioLearner({"A100": 2.5}, min_samples=40, every=1)
        for k in range(60):
            learner.add("A100", 300.0, 10, _slow(300.0, 10, 1.0), "vit" if k % 2 else "")
            learner.add("A100", 120.0, 4, _slow(120.0, 4, 1.0), "cnn" if k < 30 else "")
        return learner

    pooled = fed()
    moved = pooled.decide("A100")  # no mix: the fit of every sample
    assert moved is not None and moved < 2.5
    held = fed()
    assert held.decide("A100", {"cnn": 5.0}) is None and held.ratios["A100"] == 2.5
    assert held.workload_fits["A100"] == {}  # vit: 30 labelled samples, cnn: 30
    both = fed()
    for k in range(20):  # vit reaches 50 labelled samples: a fit of its own
        both.add("A100", 300.0 if k % 2 else 120.0, 10 if k % 2 else 4,
                 _slow(300.0 if k % 2 else 120.0, 10 if k % 2 else 4, 1.0), "vit")
    assert both.decide("A100", {"vit": 3.0, "cnn": 1.0}) is not None
    assert set(both.workload_fits["A100"]) == {"vit"}


class _Weigh:
    """A host's foresight, faked: each candidate's 'simulated' makespan from `ends`."""

    def __init__(self, ends: Any) -> None:
        self.ends = ends
        self.calls: list[tuple[str, list[float]]] = []

    def __call__(self, arch: str, candidates: Any) -> Any:
        self.calls.append((arch, list(candidates)))
        return self.ends(list(candidates))


def _counted(learner: RatioLearner) -> list[int]:
    """How many decisions the learner makes (wraps decide)."""
    made = [0]
    decide = learner.decide

    def counting(arch: str, mix: Any = None) -> float | None:
        made[0] += 1
        return decide(arch, mix)

    learner.decide = counting  # type: ignore[method-assign]
    return made


def test_foresight_steps_toward_the_ratio_whose_simulated_study_ends_first() -> None:
    # Unsaturated and packed: the progress model alone would step up (the test above);
    # the simulated study ends first at 1.5, so the ratio steps down to it.
    weigh = _Weigh(lambda rs: {r: 100.0 + min(2.5, 5.0 * abs(r - 1.5)) for r in rs})
    learner = RatioLearner({"A100": 3.0}, high=4.0, min_samples=20, every=10)
    learner.weigh = weigh
    made = _counted(learner)
    samples = [(s[0] * 300 / 260, s[1], s[2]) for s in _samples(0.2, 5000.0, most=4, k=400)]
    moves = _feed(learner, samples)
    # Up by the progress model until FORESIGHT_SAMPLES x min_samples samples, then down
    # to where the simulated study ends first, a step, then steps that grow as the
    # decisions keep agreeing (MOMENTUM), and it holds.
    assert moves == [3.25, 3.5, 3.25, 3.0, 2.5, 2.0, 1.5]
    # The ratio in force and a step either side first, then from low to high by 0.5.
    assert weigh.calls[0] == ("A100", [3.5, 3.25, 3.75, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0])
    # Simulated again at most every FORESIGHT_EVERY-th decision.
    assert 0 < len(weigh.calls) <= made[0] // FORESIGHT_EVERY + 1
    seen = learner.foreseen["A100"]
    assert (seen.target, seen.best_ratio, seen.best_s) == (1.5, 1.5, 100.0)
    # However much sooner the simulated study ends: a step at first (the step grows with
    # decisions that agree, not with the gain one simulation shows).
    steep = RatioLearner({"A100": 3.0}, high=4.0, min_samples=20, every=10)
    steep.weigh = _Weigh(lambda rs: {r: 100.0 + 50.0 * abs(r - 1.5) for r in rs})
    assert _feed(steep, samples)[:4] == [3.25, 3.5, 3.25, 3.0]
    assert "1.5 ends the work at hand soonest (100 s" in seen.describe()
    # Up past loads never seen (not packed near the ratio, no saturation known) only as
    # the progress model would go: not at all.
    eager = RatioLearner({"A100": 3.0}, high=4.0, min_samples=20, every=10)
    eager.weigh = _Weigh(lambda rs: {r: 100.0 + 10.0 * abs(r - 4.0) for r in rs})
    light = [(s[0] * 150 / 260, s[1], s[2]) for s in _samples(0.2, 5000.0, most=4, k=200)]
    assert _feed(eager, light) == [] and eager.weigh.calls  # type: ignore[attr-defined]
    assert eager.foreseen["A100"].target == 4.0
    # Nor where GPUs are packed to the ratio but a step up promises under STEP_GAIN
    # more progress (each extra trial costs 90 %): the progress model holds there.
    costly = RatioLearner({"A100": 3.0}, high=4.0, min_samples=20, every=10)
    costly.weigh = _Weigh(lambda rs: {r: 100.0 + 10.0 * abs(r - 4.0) for r in rs})
    rng = random.Random(5)
    packed = [(50.0 * n, n, (1 + 0.9 * (n - 1)) * rng.uniform(0.98, 1.02))
              for n in (rng.randint(1, 6) for _ in range(200))]
    assert _feed(costly, packed) == [] and costly.weigh.calls  # type: ignore[attr-defined]
    assert costly.foreseen["A100"].target == 4.0 and costly.ratios["A100"] == 3.0


def test_foresight_holds_within_its_margin_and_falls_back_without_an_end() -> None:
    samples = [(s[0] * 300 / 260, s[1], s[2]) for s in _samples(0.2, 5000.0, most=4, k=200)]
    # No candidate ended (or nothing to simulate): the progress model's target.
    plain = RatioLearner({"A100": 3.0}, high=4.0, min_samples=20, every=10)
    expected = _feed(plain, samples)
    assert len(expected) > 2 and expected[0] > 3.0
    # A candidate that ends under FORESIGHT_MARGIN sooner is not worth a move: once
    # foresight acts (FORESIGHT_SAMPLES x min_samples), the ratio holds.
    close = RatioLearner({"A100": 3.0}, high=4.0, min_samples=20, every=10)
    close.weigh = _Weigh(lambda rs: {r: 100.0 - (0.5 if r == 4.0 else 0.0) for r in rs})
    assert _feed(close, samples) == expected[:2]
    for ends in (lambda rs: {r: math.inf for r in rs}, lambda rs: None,
                 lambda rs: {r: -1.0 for r in rs}):
        blind = RatioLearner({"A100": 3.0}, high=4.0, min_samples=20, every=10)
        blind.weigh = _Weigh(ends)
        assert _feed(blind, samples) == expected
        assert "A100" not in blind.foreseen


def test_new_work_is_reconsidered_by_foresight_alone() -> None:
    # A study arrives: without new samples, the learner moves only where foresight (run
    # afresh for the new work) says so; the progress model, whose target comes from the
    # samples alone, never steps again on the same samples.
    samples = [(s[0] * 300 / 260, s[1], s[2]) for s in _samples(0.2, 5000.0, most=4, k=200)]
    ends = [lambda rs: {r: 100.0 for r in rs}]  # the first study: every ratio alike
    learner = RatioLearner({"A100": 3.0}, high=4.0, min_samples=20, every=10)
    weigh = _Weigh(lambda rs: ends[0](rs))
    learner.weigh = weigh
    assert learner.reconsider("A100") is None  # too few samples for foresight
    assert not weigh.calls
    for load, n, slow in samples[:FORESIGHT_SAMPLES * 20]:
        learner.add("A100", load, n, slow)
    learner.decide("A100")
    held, calls = learner.ratios["A100"], len(weigh.calls)
    assert learner.reconsider("A100") is None and learner.ratios["A100"] == held
    assert len(weigh.calls) == calls  # the same work, the same fits: the grid is kept
    ends[0] = lambda rs: {r: 100.0 + 10.0 * abs(r - 1.5) for r in rs}  # new work
    learner.forget_foresight()
    assert learner.reconsider("A100") == held - 0.25
    assert len(weigh.calls) == calls + 1
    # Without foresight, reconsidering never moves a ratio.
    plain = RatioLearner({"A100": 3.0}, high=4.0, min_samples=20, every=10)
    for load, n, slow in samples:
        plain.add("A100", load, n, slow)
    assert plain.reconsider("A100") is None and plain.ratios["A100"] == 3.0


def test_the_fitted_interference_is_the_learner_s_model() -> None:
    from hypersack.sim.interference import FittedInterference, Interference, SharedTrial

    pooled = fit(_samples(0.2, 5000.0))  # contention alone: no saturation believed
    own = fit(_samples(0.1, 135.0, seed=3))
    assert pooled is not None and own is not None
    model = FittedInterference(fits={"A100": pooled}, workload_fits={"A100": {"vit": own}})
    trials = [SharedTrial(80.0, 4.0, 0.2)] * 3  # 240 % load
    slow = model.gpu_slowdowns("A100", trials, ["vit", "resnet"])
    assert slow[0] == pytest.approx((1 + 2 * own.contention) * 240 / own.saturation_pct)
    assert slow[1] == pytest.approx(1 + 2 * pooled.contention)  # no saturation
    # The fitted slowdown is the whole iteration's; the cores count only where worse.
    assert model.rate(trials[0], 1.5, 1.2) == pytest.approx(1 / 1.5)
    assert model.rate(trials[0], 1.5, 2.0) == pytest.approx(1 / 2.0)
    # An architecture without a fit keeps the default model's GPU slowdown.
    assert model.gpu_slowdowns("H100", trials, ["vit"]) == \
        Interference().gpu_slowdowns("H100", trials, ["vit"])
