"""One invariant suite for every policy, plus each rule's defining behaviour."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypersack.core.errors import InvalidInput, UnknownName
from hypersack.policies import ClusterView, GpuBin, Item, Need, NodeBin, make_policy, policy_names
from hypersack.policies.base import Policy
from hypersack.policies.greedy import EFT_SCAN, EFT_TOLERANCE, EarliestFinishPolicy
from hypersack.policies.plans import check_plan, why_unplaced
from hypersack.testing.contracts import PolicyContract, instances

ALL = policy_names()


def gpu(node: str, index: int, compute: int = 30000, memory: int = 80000, arch: str = "A100",
        slots: int | None = None) -> GpuBin:
    return GpuBin(node, index, arch, compute, memory, compute, memory, slots)


def cluster(*nodes: tuple[str, int, list[GpuBin]]) -> ClusterView:
    return ClusterView(tuple(NodeBin(name, cores, tuple(gpus), cores)
                             for name, cores, gpus in nodes))


def item(i: int, compute: int, memory: int = 1000, cores: int = 1000, run: float = 1.0,
         arch: str = "A100") -> Item:
    return Item(f"t{i}", {arch: Need(compute, memory, cores)}, run)


@pytest.mark.parametrize("name", ALL)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances())
def test_invariants_hold_for_every_policy(name: str, instance: Any) -> None:
    items, view = instance
    # CP-SAT with one worker and a fixed seed decides the same each time it finishes (with
    # several, which finishes first depends on the machine's load); these instances take
    # milliseconds, so the limit is never what stops it, even on a loaded machine.
    policy = make_policy(name, **({"time_limit_s": 60, "workers": 1}
                                  if name == "optimal" else {}))
    plan = policy.place(items, view)
    check_plan(items, view, plan)  # nothing over capacity, nothing placed twice
    again = policy.place(items, view)
    assert again.placements == plan.placements and again.unplaced == plan.unplaced


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances(max_items=14))
def test_optimal_is_never_worse_than_a_heuristic(instance: Any) -> None:
    items, view = instance
    best = make_policy("optimal").place(items, view)
    assert best.status == "OPTIMAL"
    assert best.gap() == 0.0
    for name in ("ff", "ffd", "wf", "wfd", "pack"):
        assert make_policy(name).place(items, view).objective <= best.objective


COMPOSED = [{"order": o, "score": s, "improve": i}
            for o in ("given", "longest", "value", "density")
            for s in ("first", "worst", "best", "dot", "norm") for i in ("none", "swap")]


@pytest.mark.parametrize("options", COMPOSED, ids=lambda o: "-".join(o.values()))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances())
def test_every_composition_keeps_the_invariants(options: dict[str, str],
                                                instance: Any) -> None:
    items, view = instance
    # A generous budget: the local search always runs to its end, so it is repeatable.
    policy = make_policy("pack", **options, budget_ms=10_000)
    plan = policy.place(items, view)
    check_plan(items, view, plan)
    again = policy.place(items, view)
    assert sorted(again.placements, key=str) == sorted(plan.placements, key=str)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances(max_items=30))
def test_pairs_keep_the_invariants_and_never_place_less_than_repack(instance: Any) -> None:
    # GPUs emptied two at a time and refilled: what was placed stays placed or is
    # replaced by more, nothing goes over a capacity, the plan repeats, and it never
    # beats the optimum (which would mean a capacity was not counted).
    items, view = instance
    pairs = make_policy("pack", improve="pairs", budget_ms=10_000)
    plan = pairs.place(items, view)
    check_plan(items, view, plan)
    again = pairs.place(items, view)
    assert sorted(again.placements, key=str) == sorted(plan.placements, key=str)
    repack = make_policy("pack", budget_ms=10_000).place(items, view)
    best = make_policy("optimal", time_limit_s=60, workers=1).place(items, view)
    assert repack.objective <= plan.objective <= best.objective


def brute_force(items: list[Item], view: ClusterView) -> int:
    gpus = view.gpus()
    best = 0
    for choice in itertools.product(range(-1, len(gpus)), repeat=len(items)):
        c = {i: g.compute for i, g in enumerate(gpus)}
        m = {i: g.memory for i, g in enumerate(gpus)}
        q = {n.name: n.cores for n in view.nodes}
        total, ok = 0, True
        for it, g in zip(items, choice, strict=True):
            if g < 0:
                continue
            need = it.needs.get(gpus[g].arch)
            if need is None:
                ok = False
                break
            c[g] -= need.compute
            m[g] -= need.memory
            q[gpus[g].node] -= need.cores
            total += it.value
        if ok and min(c.values()) >= 0 and min(m.values()) >= 0 and min(q.values()) >= 0:
            best = max(best, total)
    return best


def test_optimal_matches_brute_force_on_a_tricky_instance() -> None:
    # Greedy by size takes 60 first and wastes 40; the optimum pairs 50+50 and 70+30.
    items = [item(0, 6000), item(1, 5000), item(2, 5000), item(3, 7000), item(4, 3000)]
    view = cluster(("a", 64000, [gpu("a", 0, 10000), gpu("a", 1, 10000)]))
    best = make_policy("optimal").place(items, view)
    assert best.objective == brute_force(items, view) == 20000


def test_first_fit_takes_the_first_gpu_and_worst_fit_the_freest() -> None:
    view = cluster(("a", 64000, [gpu("a", 0, 10000), gpu("a", 1, 20000)]),
                   ("b", 64000, [gpu("b", 0, 25000)]))
    items = [item(0, 5000)]
    assert make_policy("ff").place(items, view).placements[0].node == "a"
    assert make_policy("ff").place(items, view).placements[0].gpu_index == 0
    wf = make_policy("wf").place(items, view).placements[0]
    assert (wf.node, wf.gpu_index) == ("b", 0)


def test_worst_fit_balances_and_breaks_ties_by_order() -> None:
    view = cluster(("a", 64000, [gpu("a", 0), gpu("a", 1)]))
    plan = make_policy("wf").place([item(i, 1000) for i in range(4)], view)
    assert [p.gpu_index for p in plan.placements] == [0, 1, 0, 1]
    ff = make_policy("ff").place([item(i, 1000) for i in range(4)], view)
    assert [p.gpu_index for p in ff.placements] == [0, 0, 0, 0]


def test_decreasing_places_the_longest_trials_first() -> None:
    view = cluster(("a", 64000, [gpu("a", 0, 10000)]))
    items = [item(0, 6000, run=1.0), item(1, 6000, run=9.0)]
    assert [p.item_id for p in make_policy("ff").place(items, view).placements] == ["t0"]
    assert [p.item_id for p in make_policy("ffd").place(items, view).placements] == ["t1"]
    assert [p.item_id for p in make_policy("wfd").place(items, view).placements] == ["t1"]


def test_node_cores_memory_slots_and_architecture_are_respected() -> None:
    view = cluster(("a", 3000, [gpu("a", 0), gpu("a", 1)]),
                   ("b", 64000, [gpu("b", 0, memory=1500), gpu("b", 1, arch="H100", slots=1)]))
    items = [item(i, 1000, memory=1000, cores=1000) for i in range(8)]
    for name in ALL:
        plan = make_policy(name).place(items, view)
        check_plan(items, view, plan)
        per = {(p.node, p.gpu_index) for p in plan.placements}
        assert ("b", 1) not in per  # H100 without a profile for it
        assert sum(p.node == "a" for p in plan.placements) == 3  # 3 cores on node a
        assert sum(p.node == "b" for p in plan.placements) == 1  # memory 1500 on b:0


def test_why_unplaced_explains() -> None:
    view = cluster(("a", 64000, [gpu("a", 0, 10000, memory=4000)]))
    items = [item(0, 8000), item(1, 8000), item(2, 1000, memory=9000), item(3, 1, arch="V100")]
    plan = make_policy("wfd").place(items, view)
    reasons = {i: why_unplaced(next(x for x in items if x.id == i), view, plan, items)
               for i in plan.unplaced}
    assert "waiting for capacity" in reasons["t1"] and "1 short of compute" in reasons["t1"]
    assert "more than any GPU or node offers when empty" in reasons["t2"]
    assert "no profile for the cluster's architectures ['A100']" in reasons["t3"]


def test_registry_fails_loudly() -> None:
    with pytest.raises(UnknownName,
                       match="unknown policy 'bestfit'; valid: auto, eft, ff, ffd, optimal"):
        make_policy("bestfit")
    with pytest.raises(InvalidInput, match="has no option 'depth'; valid: time_limit_s"):
        make_policy("optimal", depth=3)
    with pytest.raises(InvalidInput, match=r"policy 'wfd' has no option 'x'; valid: hetero"):
        make_policy("wfd", x=1)
    with pytest.raises(InvalidInput, match="time_limit_s: Input should be greater than 0"):
        make_policy("optimal", time_limit_s=0)
    with pytest.raises(InvalidInput, match="score: Input should be 'first', 'worst'"):
        make_policy("pack", score="random")


def naive(items: list[Item], view: ClusterView, *, decreasing: bool, worst: bool
          ) -> list[tuple[str, str, int]]:
    """The paper's rules written plainly, O(P x G): the fast versions must agree exactly."""
    gpus = view.gpus()
    c = [g.compute for g in gpus]
    m = [g.memory for g in gpus]
    s = [1 << 60 if g.slots is None else g.slots for g in gpus]
    q = {n.name: n.cores for n in view.nodes}
    order = sorted(items, key=lambda it: -it.run_time_s) if decreasing else items
    out = []
    for it in order:
        fits = []
        for g, b in enumerate(gpus):
            need = it.needs.get(b.arch)
            if need and c[g] >= need.compute and m[g] >= need.memory and s[g] > 0 \
                    and q[b.node] >= need.cores:
                fits.append(g)
        if not fits:
            continue
        g = max(fits, key=lambda g: (c[g], -g)) if worst else fits[0]
        need = it.needs[gpus[g].arch]
        c[g] -= need.compute
        m[g] -= need.memory
        s[g] -= 1
        q[gpus[g].node] -= need.cores
        out.append((it.id, gpus[g].node, gpus[g].index))
    return out


@pytest.mark.parametrize("name,decreasing,worst", [
    ("ff", False, False), ("ffd", True, False), ("wf", False, True), ("wfd", True, True)])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances(max_items=40))
def test_fast_greedy_rules_decide_exactly_as_the_plain_rules(
        name: str, decreasing: bool, worst: bool, instance: Any) -> None:
    items, view = instance
    plan = make_policy(name).place(items, view)
    got = [(p.item_id, p.node, p.gpu_index) for p in plan.placements]
    assert got == naive(items, view, decreasing=decreasing, worst=worst)


class TestTheDefaultPolicyKeepsTheContract(PolicyContract):
    """The contract a plug-in policy is checked by (hypersack.testing.contracts), on the
    default policy; every registered one is checked above on the same instances."""

    def make_policy(self) -> Policy:
        return make_policy("auto")


def naive_eft(items: list[Item], view: ClusterView) -> list[tuple[str, str, int]]:
    """`eft` written plainly, O(P x G): longest first; per architecture, the GPU that took
    nothing yet with the most free share of scaled compute, and the EFT_SCAN that took
    something whose longest items end first (then most free); of those, the ones where
    the item would end (its run time there, or the longest placed there in this decision)
    within EFT_TOLERANCE of the soonest, the most free, then the sooner end, then the
    first."""
    gpus = view.gpus()
    c = [g.compute for g in gpus]
    m = [g.memory for g in gpus]
    s = [1 << 60 if g.slots is None else g.slots for g in gpus]
    q = {n.name: n.cores for n in view.nodes}
    longest = [0.0] * len(gpus)
    touched = [False] * len(gpus)
    out = []
    for it in sorted(items, key=lambda it: -it.run_time_s):
        found = []
        for arch in sorted({b.arch for b in gpus}):
            need = it.needs.get(arch)
            if need is None:
                continue
            run = it.run_time_s / it.speed.get(arch, 1.0) if it.speed else it.run_time_s
            fits = [g for g, b in enumerate(gpus) if b.arch == arch and c[g] >= need.compute
                    and m[g] >= need.memory and s[g] > 0 and q[b.node] >= need.cores]
            share = {g: -c[g] / max(1, gpus[g].full_compute) for g in fits}
            fresh = sorted((g for g in fits if not touched[g]), key=lambda g: (share[g], g))
            used = sorted((g for g in fits if touched[g]),
                          key=lambda g: (longest[g], share[g], g))[:EFT_SCAN]
            found += [(max(longest[g], run), share[g], g, run) for g in fresh[:1] + used]
        if not found:
            continue
        soonest = min(f[0] for f in found) * (1 + EFT_TOLERANCE)
        _, _, g, run = min((f for f in found if f[0] <= soonest),
                           key=lambda f: (f[1], f[0], f[2]))
        need = it.needs[gpus[g].arch]
        c[g] -= need.compute
        m[g] -= need.memory
        s[g] -= 1
        q[gpus[g].node] -= need.cores
        longest[g] = max(longest[g], run)
        touched[g] = True
        out.append((it.id, gpus[g].node, gpus[g].index))
    return out


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instance=instances(max_items=40), speeds=st.lists(st.floats(1.0, 4.0), min_size=4,
                                                        max_size=4))
def test_fast_earliest_finish_decides_exactly_as_the_plain_rule(
        instance: Any, speeds: list[float]) -> None:
    items, view = instance
    archs = sorted({g.arch for g in view.gpus()} | {a for it in items for a in it.needs})
    # Some items run faster on some architectures (a trial's or a fused group's speed).
    items = [replace(it, speed={a: speeds[(k + j) % 4] for j, a in enumerate(archs)})
             if k % 3 else it for k, it in enumerate(items)]
    plan = EarliestFinishPolicy().rule(items, view)
    check_plan(items, view, plan)
    got = [(p.item_id, p.node, p.gpu_index) for p in plan.placements]
    assert got == naive_eft(items, view)
    check_plan(items, view, make_policy("eft").place(items, view))  # preference first


def test_eft_gives_the_longest_work_to_the_fastest_gpus_and_spreads_it() -> None:
    # Two H100s (twice as fast) and two A100s, each with room for two items; four long
    # items (10 s on an A100, 5 s on an H100) and four short ones. The first two long
    # ones take an H100 each; the next two end at 5 s beside them there and at 10 s on
    # an empty A100, so they double up on the H100s; the short ones take the A100s.
    a100 = [gpu("a", i, 20000, arch="A100") for i in range(2)]
    h100 = [gpu("b", i, 20000, arch="H100") for i in range(2)]
    view = cluster(("a", 64000, a100), ("b", 64000, h100))
    speed = {"A100": 1.0, "H100": 2.0}
    needs = {"A100": Need(10000, 1000, 1000), "H100": Need(10000, 1000, 1000)}
    items = [Item(f"long{i}", needs, 10.0, speed=speed) for i in range(4)] + \
        [Item(f"short{i}", needs, 4.0, speed=speed) for i in range(4)]
    plan = make_policy("eft").place(items, view)
    where = {p.item_id: p.node for p in plan.placements}
    assert [where[f"long{i}"] for i in range(4)] == ["b"] * 4
    assert [where[f"short{i}"] for i in range(4)] == ["a"] * 4
    # Blind (hetero false), every item ends at its longest run time everywhere: the long
    # ones spread over all four GPUs, as wfd does.
    blind = {p.item_id: p.node for p in make_policy("eft", hetero=False).place(items,
                                                                              view).placements}
    assert [blind[f"long{i}"] for i in range(4)] == ["a", "a", "b", "b"]
    # wfd, blind to where an item ends, spreads the long ones over all four GPUs.
    wfd = {p.item_id: p.node for p in make_policy("wfd").place(items, view).placements}
    assert sorted(wfd[f"long{i}"] for i in range(4)) == ["a", "a", "b", "b"]


def test_eft_spreads_items_over_gpus_that_end_them_about_as_soon() -> None:
    """A strict soonest end piles each next item on the GPU whose longest ends first; GPUs
    within EFT_TOLERANCE of the soonest end count as soon, and the most free takes it. A
    GPU past the tolerance does not (its long item would hold the short ones back)."""
    assert 30 > 10 * (1 + EFT_TOLERANCE) and 10 <= 9 * (1 + EFT_TOLERANCE)
    view = cluster(("a", 64000, [gpu("a", 0, 40000), gpu("a", 1, 40000)]),
                   ("b", 64000, [gpu("b", 0, 40000)]))
    needs = {"A100": Need(10000, 1000, 1000)}
    items = [Item(f"t{s}", needs, float(s)) for s in (30, 10, 9, 8, 7, 6)]
    got = {p.item_id: (p.node, p.gpu_index)
           for p in EarliestFinishPolicy().rule(items, view).placements}
    alone = got["t30"]  # the longest: its GPU ends at 30, past 1.3 x 10 for the others
    assert [k for k, v in got.items() if v == alone] == ["t30"]
    # The five others over the two GPUs that end them by 10 and 9 (within 20 %), the
    # most free first: 3 and 2, where the strict rule put 1 and 4.
    assert sorted(sum(v == w for v in got.values()) for w in set(got.values()) - {alone}) \
        == [2, 3]
    assert got == {i: (n, g) for i, n, g in naive_eft(items, view)}
    strict = {p.item_id: (p.node, p.gpu_index)
              for p in EarliestFinishPolicy(tolerance=0.0).rule(items, view).placements}
    assert sorted(sum(v == w for v in strict.values()) for w in set(strict.values())) \
        == [1, 1, 4]  # the strict rule, as `auto` keeps it
    assert {p.item_id: (p.node, p.gpu_index)
            for p in make_policy("auto").place(items, view).placements} == strict
    with pytest.raises(ValueError):
        EarliestFinishPolicy(tolerance=math.nan)


def test_eft_gives_an_architecture_to_the_models_that_gain_most_there() -> None:
    # One H100 and one A100, room for two items each. The CNNs run longest and gain
    # 1.5x from the H100 (the A100 would end them past EFT_TOLERANCE of the H100), the
    # transformers 3x: the soonest end alone gives the H100 to the longest (the CNNs);
    # with the preference first (the default), the transformers take the H100 and the
    # CNNs the A100.
    view = cluster(("a", 64000, [gpu("a", 0, 20000, arch="A100")]),
                   ("b", 64000, [gpu("b", 0, 20000, arch="H100")]))
    needs = {"A100": Need(10000, 1000, 1000), "H100": Need(10000, 1000, 1000)}
    cnn, vit = {"A100": 1.0, "H100": 1.5}, {"A100": 1.0, "H100": 3.0}
    items = [Item(f"cnn{i}", needs, 10.0, speed=cnn) for i in range(2)] + \
        [Item(f"vit{i}", needs, 8.0, speed=vit) for i in range(2)]
    rule = {p.item_id: p.node for p in EarliestFinishPolicy().rule(items, view).placements}
    assert rule == {"cnn0": "b", "cnn1": "b", "vit0": "a", "vit1": "a"}
    aware = {p.item_id: p.node for p in make_policy("eft").place(items, view).placements}
    assert aware == {"cnn0": "a", "cnn1": "a", "vit0": "b", "vit1": "b"}
