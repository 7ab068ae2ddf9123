"""The default policy `predict`: each study's rule chosen once, before its first decision,
as the candidate whose simulated study ends first (orchestrator/foresight.py), with a
stand-in for the simulator here; tests/sim/test_foresight.py runs the real one."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pytest

from hypersack.core.clock import ManualClock
from hypersack.core.cluster import parse_shorthand
from hypersack.core.errors import InvalidInput
from hypersack.core.types import NodeSpec, Profile, TrialState
from hypersack.grid.space import SearchSpace, parse_space
from hypersack.orchestrator import NodeJoined, Orchestrator, OrchestratorConfig, StudySubmitted
from hypersack.orchestrator.events import ProfileMeasured, Tick, TrialFinished
from hypersack.policies import make_policy
from hypersack.store import MemoryStore
from hypersack.testing.core import prof
from hypersack.testing.pools import HeldPool


class Seer:
    """A stand-in simulator: the makespans it is told to predict, and its calls."""

    def __init__(self, ends: Mapping[str, float]) -> None:
        self.ends = dict(ends)
        self.calls: list[tuple[str, int, int, tuple[str, ...]]] = []

    def __call__(self, space: SearchSpace, nodes: Sequence[NodeSpec],
                 profiles: Sequence[Profile], config: OrchestratorConfig,
                 candidates: Sequence[str]) -> Mapping[str, float]:
        self.calls.append((space.name, len(nodes), len(profiles), tuple(candidates)))
        return {c: self.ends.get(c, 1000.0) for c in candidates}


def _space(name: str = "s", n: int = 6, **settings: Any) -> SearchSpace:
    data: dict[str, Any] = {
        "name": name, "models": ["resnet18"],
        "hyperparameters": {"batch_size": [64], "lr": [0.001 * (i + 1) for i in range(n)]},
        "settings": {"fusion": "off", **settings}}
    return parse_space(data)


def _orch(seer: Seer | None, profiles: list[Profile] | None = None,
          nodes: str = "2x2xA100-80GB", **config: Any) -> Orchestrator:
    store = MemoryStore()
    for p in [prof("resnet18", 64)] if profiles is None else profiles:
        store.put_profile(p)
    orch = Orchestrator(store, ManualClock(0.0), OrchestratorConfig(foresight=seer, **config))
    for node in parse_shorthand(nodes).nodes:
        orch.handle(NodeJoined(node))
    return orch


def _rules(orch: Orchestrator, study_id: str) -> set[str]:
    return {d.policy for d in orch.decisions if d.study_id == study_id}


def test_the_default_policy_is_predict_and_it_takes_the_rule_that_ends_first() -> None:
    assert _space().settings.policy == "predict"
    seer = Seer({"eft": 500.0, "wfd": 430.0, "ffd": 430.0, "ff": 470.0})
    orch = _orch(seer)
    orch.handle(StudySubmitted(_space()))
    # Simulated once, with the study, the two nodes, the one profile and every candidate;
    # of the two that end first, the earlier candidate (wfd before ffd).
    assert seer.calls == [("s", 2, 1, ("eft", "auto", "wfd", "ffd", "wf", "ff"))]
    assert _rules(orch, "s-1") == {"wfd"}
    waiting = [t for t in orch.trials("s-1") if t.state == TrialState.PENDING]
    if waiting:
        line = next(x for x in orch.explain(waiting[0].id) if "predict" in x)
        assert "rule wfd: its simulated study ends first" in line
        assert "wfd 430 s" in line and "eft 500 s" in line
    # Later decisions of the study use the choice without simulating again.
    for t in [t for t in orch.trials("s-1") if t.state == TrialState.RUNNING]:
        orch.handle(TrialFinished(t.id, t.node or "", attempt=t.launches))
    assert len(seer.calls) == 1
    assert _rules(orch, "s-1") == {"wfd"}


def test_a_named_policy_and_the_servers_policy_are_never_second_guessed() -> None:
    seer = Seer({"wfd": 1.0})
    orch = _orch(seer)
    orch.handle(StudySubmitted(_space(policy="eft")))
    assert seer.calls == [] and _rules(orch, "s-1") == {"eft"}
    orch = _orch(seer, policy="ff")
    orch.handle(StudySubmitted(_space()))
    assert seer.calls == [] and _rules(orch, "s-1") == {"ff"}


@pytest.mark.parametrize(("extra", "why"), [
    ({"search": {"type": "optuna", "trials": 6}}, "adaptive search or a pruner"),
    ({"pruner": {"type": "asha", "min_epochs": 1, "reduction_factor": 2}},
     "adaptive search or a pruner"),
])
def test_a_study_whose_course_depends_on_results_takes_the_fallback(
        extra: dict[str, Any], why: str) -> None:
    seer = Seer({"wfd": 1.0})
    orch = _orch(seer)
    data = _space().model_dump(mode="json", exclude_defaults=True)
    data.update(extra)
    data["settings"]["epochs"] = 4
    orch.handle(StudySubmitted(parse_space(data)))
    assert seer.calls == [] and _rules(orch, "s-1") == {"eft"}
    assert why in orch.rule_choice("s-1").why


def test_past_max_trials_or_max_gpus_the_fallback_places_without_a_simulation() -> None:
    seer = Seer({"wfd": 1.0})
    orch = _orch(seer, policy_options={"predict": {"max_trials": 5}})
    orch.handle(StudySubmitted(_space(n=6)))
    assert seer.calls == [] and _rules(orch, "s-1") == {"eft"}
    assert "6 trials, more than predict's max_trials (5)" in \
        orch.rule_choice("s-1").why
    orch = _orch(seer, policy_options={"predict": {"max_gpus": 3}})
    orch.handle(StudySubmitted(_space(n=6)))
    assert seer.calls == [] and "4 GPUs, more than predict's max_gpus (3)" in \
        orch.rule_choice("s-1").why


def test_the_choice_waits_for_a_profile_and_simulates_where_profiles_are_known() -> None:
    seer = Seer({"wf": 1.0})
    orch = _orch(seer, profiles=[], nodes="1x2xA100-80GB,1x2xH100-80GB")
    orch.handle(StudySubmitted(_space()))
    assert seer.calls == [] and orch.rule_choice("s-1") is None  # profiles first
    # The first decision: the A100 node, where the profile is in (the H100 one is not).
    orch.handle(ProfileMeasured(prof("resnet18", 64), "node0"))
    assert seer.calls == [("s", 1, 1, ("eft", "auto", "wfd", "ffd", "wf", "ff"))]
    assert _rules(orch, "s-1") == {"wf"}
    orch.handle(ProfileMeasured(prof("resnet18", 64, arch="H100"), "node1"))
    assert len(seer.calls) == 1  # final for the study


def test_no_simulator_or_no_candidate_that_ends_means_the_fallback() -> None:
    orch = _orch(None)
    orch.handle(StudySubmitted(_space()))
    assert _rules(orch, "s-1") == {"eft"}
    assert orch.rule_choice("s-1").why == "no simulator in this process"
    seer = Seer({c: math.inf for c in ("eft", "auto", "wfd", "ffd", "wf", "ff")})
    orch = _orch(seer)
    orch.handle(StudySubmitted(_space()))
    choice = orch.rule_choice("s-1")
    assert choice.rule == "eft" and "no candidate ended" in choice.why
    assert "eft did not end" in choice.describe()


def test_a_simulation_that_fails_leaves_the_study_to_the_fallback() -> None:
    class Broken(Seer):
        def __call__(self, *args: Any) -> Mapping[str, float]:
            super().__call__(*args)
            raise RuntimeError("boom")

    seer = Broken({})
    orch = _orch(seer)
    orch.handle(StudySubmitted(_space()))
    assert len(seer.calls) == 1 and _rules(orch, "s-1") == {"eft"}
    assert any(t.state == TrialState.RUNNING for t in orch.trials("s-1"))
    choice = orch.rule_choice("s-1")
    assert choice is not None and choice.why == "the simulation failed (RuntimeError: boom)"


def test_candidates_are_options_checked_like_any_policys() -> None:
    seer = Seer({"ff": 2.0, "wfd": 3.0})
    orch = _orch(seer, policy_options={"predict": {"candidates": ["wfd", "ff"]}})
    orch.handle(StudySubmitted(_space()))
    assert seer.calls[0][3] == ("wfd", "ff") and _rules(orch, "s-1") == {"ff"}
    for bad, said in (({"candidates": ["nope"]}, "candidate 'nope' is not a registered"),
                      ({"candidates": ["predict"]}, "cannot be its own candidate"),
                      ({"candidates": ["ff", "ff"]}, "named twice"),
                      ({"candidates": []}, "candidates"),
                      ({"max_trials": -1}, "max_trials")):
        with pytest.raises(InvalidInput, match=said):
            make_policy("predict", **bad)


def test_placed_directly_predict_is_its_fallback() -> None:
    from hypersack.sim.instances import heterogeneous

    items, view = heterogeneous("memory", 0)
    direct = make_policy("predict").place(items, view)
    eft = make_policy("eft").place(items, view)
    assert direct.placements == eft.placements


def _finish_running(orch: Orchestrator, study_id: str) -> None:
    for t in [t for t in orch.trials(study_id) if t.state == TrialState.RUNNING]:
        orch.handle(TrialFinished(t.id, t.node or "", attempt=t.launches))


def _running(orch: Orchestrator, study_id: str) -> int:
    return sum(t.state == TrialState.RUNNING for t in orch.trials(study_id))


def test_with_a_pool_a_study_alone_waits_for_its_choice() -> None:
    seer = Seer({"wfd": 430.0})
    pool = HeldPool()
    orch = _orch(seer, foresight_pool=pool, foresight_wait_s=0.0, nodes="1x2xA100-80GB",
                 exclusive=True)  # one trial a GPU: a decision per exit
    orch.handle(StudySubmitted(_space(n=12, epochs=1)))
    # The pool readied as the study arrived; the simulation handed to it, not run here:
    # the decision did not wait for it, and the study's trials wait for the choice.
    assert pool.calls[0][1] is bool and len(pool.simulations) == 1 and seer.calls == []
    assert orch.rule_choice("s-1") is None and _running(orch, "s-1") == 0
    # 1 % of its compute work (12 trials' run time x compute share) over 2 A100s at 3.
    p = prof("resnet18", 64)
    held = orch.s.clock.now() + \
        0.01 * 12 * p.run_time_s(1) * p.demand.compute_pct / 100 / (2 * 3)
    assert orch.wake_at() == pytest.approx(held)
    waiting = orch.trials("s-1")[0]
    assert any("its trials wait for the choice (at most" in x
               for x in orch.explain(waiting.id))
    # The choice comes in: the next tick takes it, and the study's first decision is
    # the chosen rule's (its fallback placed nothing).
    pool.finish()
    orch.handle(Tick())
    choice = orch.rule_choice("s-1")
    assert choice is not None and choice.rule == "wfd" and len(seer.calls) == 1
    assert _running(orch, "s-1") == 2 and _rules(orch, "s-1") == {"wfd"}
    assert orch.wake_at() is None


def test_a_study_is_not_held_while_another_waits_for_gpus() -> None:
    """Held while others wait, the study would find the GPUs they took meanwhile and
    wait for their trials to end: it is placed by its fallback at once instead."""
    pool = HeldPool()
    orch = _orch(Seer({"wfd": 430.0}), foresight_pool=pool, foresight_wait_s=0.0,
                 nodes="1x2xA100-80GB", exclusive=True)
    orch.handle(StudySubmitted(_space(n=12, epochs=1)))
    assert _running(orch, "s-1") == 0  # alone: held
    orch.handle(StudySubmitted(_space(name="other", n=4, policy="ff")))
    assert _running(orch, "s-1") + _running(orch, "other-1") == 2
    assert _running(orch, "s-1") >= 1 and "eft" in _rules(orch, "s-1")
    assert orch.rule_choice("s-1") is None  # still being simulated
    pool.finish()
    orch.handle(Tick())
    choice = orch.rule_choice("s-1")
    assert choice is not None and choice.rule == "wfd"


def test_past_its_hold_the_fallback_places_the_study_until_the_choice_is_in() -> None:
    seer = Seer({"wfd": 430.0})
    pool = HeldPool()
    orch = _orch(seer, foresight_pool=pool, foresight_wait_s=0.0, nodes="1x1xA100-80GB",
                 exclusive=True)
    orch.handle(StudySubmitted(_space(n=12, epochs=1)))
    assert _running(orch, "s-1") == 0
    wake = orch.wake_at()
    assert wake is not None
    orch.s.clock.advance(wake - orch.s.clock.now() - 1e-6)
    orch.handle(Tick())
    assert _running(orch, "s-1") == 0  # not yet
    orch.s.clock.advance(1e-3)
    orch.handle(Tick())  # the hold is over: the fallback places
    assert _running(orch, "s-1") == 1 and _rules(orch, "s-1") == {"eft"}
    assert orch.wake_at() is None
    waiting = next(t for t in orch.trials("s-1") if t.state == TrialState.PENDING)
    assert any("being simulated; eft places it until the choice is in" in x
               for x in orch.explain(waiting.id))
    _finish_running(orch, "s-1")  # a decision while it runs: the fallback again
    assert len(pool.simulations) == 1 and _rules(orch, "s-1") == {"eft"}
    pool.finish()
    orch.handle(Tick())  # a tick takes the choice in
    choice = orch.rule_choice("s-1")
    assert choice is not None and choice.rule == "wfd" and len(seer.calls) == 1
    _finish_running(orch, "s-1")
    assert orch.decisions[-1].policy == "wfd"
    waiting = next(t for t in orch.trials("s-1") if t.state == TrialState.PENDING)
    assert any("rule wfd: its simulated study ends first" in x
               for x in orch.explain(waiting.id))


def test_a_pool_is_readied_only_for_studies_it_will_simulate() -> None:
    pool = HeldPool()
    orch = _orch(Seer({}), foresight_pool=pool, foresight_wait_s=0.0)
    orch.handle(StudySubmitted(_space(policy="wfd")))
    data = _space(name="a").model_dump(mode="json", exclude_defaults=True)
    data["pruner"] = {"type": "asha", "min_epochs": 1, "reduction_factor": 2}
    data["settings"]["epochs"] = 4
    orch.handle(StudySubmitted(parse_space(data)))
    assert pool.calls == []
    orch.handle(StudySubmitted(_space(name="p")))
    assert [c[1] for c in pool.calls][:1] == [bool]


def test_a_pool_that_answers_within_the_wait_places_the_first_decision() -> None:
    seer = Seer({"ff": 1.0})
    with ThreadPoolExecutor(1) as pool:
        orch = _orch(seer, foresight_pool=pool, foresight_wait_s=30.0)
        orch.handle(StudySubmitted(_space()))
    assert len(seer.calls) == 1 and _rules(orch, "s-1") == {"ff"}


def test_a_pool_that_fails_or_refuses_leaves_the_study_to_the_fallback() -> None:
    class Refusing(HeldPool):
        def submit(self, fn: Callable[..., Any], /, *args: Any,
                   **kwargs: Any) -> Future[Any]:
            raise RuntimeError("the simulation process is shut down")

    orch = _orch(Seer({"wfd": 1.0}), foresight_pool=Refusing(), foresight_wait_s=0.0)
    orch.handle(StudySubmitted(_space()))
    choice = orch.rule_choice("s-1")
    assert choice is not None and choice.rule == "eft"
    assert "the simulation failed (RuntimeError: the simulation process is shut down)" \
        == choice.why
    pool = HeldPool()
    orch = _orch(Seer({"wfd": 1.0}), foresight_pool=pool, foresight_wait_s=0.0,
                 nodes="1x1xA100-80GB", exclusive=True)
    orch.handle(StudySubmitted(_space(n=12, epochs=1)))
    pool.simulations[0][0].set_exception(RuntimeError("the simulation process ended"))
    orch.handle(Tick())
    choice = orch.rule_choice("s-1")
    assert choice is not None and choice.rule == "eft" and "process ended" in choice.why
    assert _running(orch, "s-1") == 1  # placed at once by the fallback
