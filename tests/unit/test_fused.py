"""Fused training equals separate training: K=4 members trained together for a few
steps match 4 separate runs with the same seeds, for a convolutional model with
BatchNorm (ResNet-18) and a transformer (BERT-Tiny); a member made NaN is masked and the
other three still match their separate runs."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from hypersack.runner.fused import FusedGroup, Member  # noqa: E402
from hypersack.runner.zoo import build  # noqa: E402

STEPS = 3


@pytest.fixture
def float64() -> Iterator[None]:
    """In double precision fused and separate runs agree to rounding (1e-12): the math
    is the same. In single precision the reduction order inside a vmapped convolution
    differs, and BatchNorm over a batch of 4 magnifies that rounding over the steps (to
    about 1e-4 of a parameter), so exactness is checked in float64."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.allclose(a, b, rtol=1e-9, atol=1e-11))


def no_dropout(name: str) -> Callable[[], nn.Module]:
    from hypersack.testing.fusion import without_dropout

    return without_dropout(lambda: build(name))


def data(name: str) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    if name == "bert_tiny":
        return [(torch.randint(1, 1000, (4, 16), generator=g),
                 torch.randint(0, 2, (4,), generator=g)) for _ in range(STEPS)]
    return [(torch.randn(4, 3, 32, 32, generator=g), torch.randint(0, 10, (4,), generator=g))
            for _ in range(STEPS)]


MEMBERS = [Member("t0", lr=0.05, momentum=0.9, seed=0),
           Member("t1", lr=0.01, momentum=0.0, weight_decay=1e-3, seed=1),
           Member("t2", lr=0.1, momentum=0.5, seed=2, clip_norm=0.5),
           Member("t3", lr=0.02, momentum=0.9, weight_decay=5e-4, seed=3)]


# Adam's members differ in betas and epsilon too.
ADAM_MEMBERS = [Member("a0", lr=1e-3, seed=0),
                Member("a1", lr=3e-3, weight_decay=1e-2, beta1=0.8, seed=1),
                Member("a2", lr=1e-2, beta2=0.99, eps=1e-6, seed=2, clip_norm=0.5),
                Member("a3", lr=5e-4, weight_decay=1e-3, beta1=0.5, beta2=0.9, seed=3)]


def separate(make: Callable[[], nn.Module], m: Member,
             batches: list[tuple[torch.Tensor, torch.Tensor]],
             optimizer: str = "sgd", clip_value: float | None = None
             ) -> tuple[list[float], dict]:
    torch.manual_seed(m.seed)
    model = make().train()
    opt: torch.optim.Optimizer
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=m.lr, momentum=m.momentum,
                              weight_decay=m.weight_decay)
    else:
        kind = torch.optim.Adam if optimizer == "adam" else torch.optim.AdamW
        opt = kind(model.parameters(), lr=m.lr, betas=(m.beta1, m.beta2), eps=m.eps,
                   weight_decay=m.weight_decay)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if m.clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), m.clip_norm)
        if clip_value is not None:
            torch.nn.utils.clip_grad_value_(model.parameters(), clip_value)
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model.state_dict()


@pytest.mark.parametrize("name", ["resnet18", "bert_tiny"])
def test_fused_members_equal_separate_runs(name: str, float64: None) -> None:
    make, batches = no_dropout(name), data(name)
    group = FusedGroup(make, MEMBERS)
    fused = [group.step(x, y).tolist() for x, y in batches]
    for k, m in enumerate(MEMBERS):
        losses, state = separate(make, m, batches)
        assert [row[k] for row in fused] == pytest.approx(losses, rel=1e-9)
        mine = group.member_state(k)
        for key, value in state.items():
            if value.is_floating_point():
                assert close(mine[key], value), (name, m.trial_id, key)


@pytest.mark.parametrize(("name", "optimizer"), [("resnet18", "adam"),
                                                 ("bert_tiny", "adamw")])
def test_fused_adam_members_equal_separate_runs(name: str, optimizer: str,
                                                float64: None) -> None:
    """Adam and AdamW fuse too, each member with its own learning rate, betas,
    epsilon, weight decay and clipping."""
    make, batches = no_dropout(name), data(name)
    group = FusedGroup(make, ADAM_MEMBERS, optimizer=optimizer)
    fused = [group.step(x, y).tolist() for x, y in batches]
    for k, m in enumerate(ADAM_MEMBERS):
        losses, state = separate(make, m, batches, optimizer)
        assert [row[k] for row in fused] == pytest.approx(losses, rel=1e-9)
        mine = group.member_state(k)
        for key, value in state.items():
            if value.is_floating_point():
                assert close(mine[key], value), (name, optimizer, m.trial_id, key)


def test_fused_members_clip_each_gradient_element_as_separate_runs(float64: None) -> None:
    """program.options.clip_grad_value: every member's gradients clamped, as
    torch.nn.utils.clip_grad_value_ does in a separate run."""
    make, batches = no_dropout("resnet18"), data("resnet18")[:2]
    members = [Member(m.trial_id, lr=m.lr, seed=m.seed) for m in ADAM_MEMBERS[:2]]
    group = FusedGroup(make, members, optimizer="adam", clip_value=0.01)
    fused = [group.step(x, y).tolist() for x, y in batches]
    for k, m in enumerate(members):
        losses, state = separate(make, m, batches, "adam", clip_value=0.01)
        assert [row[k] for row in fused] == pytest.approx(losses, rel=1e-9)
        mine = group.member_state(k)
        for key, value in state.items():
            if value.is_floating_point():
                assert close(mine[key], value), (m.trial_id, key)
    unclipped, _ = separate(make, members[0], batches, "adam")
    assert unclipped != pytest.approx([row[0] for row in fused], rel=1e-9)  # it did clip


def test_a_nan_adam_member_is_masked(float64: None) -> None:
    make, batches = no_dropout("bert_tiny"), data("bert_tiny")
    group = FusedGroup(make, ADAM_MEMBERS, optimizer="adamw")
    first = group.step(*batches[0])
    name = next(iter(group.params))
    group.params[name][2].fill_(math.inf)
    rest = [group.step(x, y) for x, y in batches[1:]]
    assert group.diverged == ["a2"]
    for k in (0, 1, 3):
        losses, state = separate(make, ADAM_MEMBERS[k], batches, "adamw")
        assert [float(first[k])] + [float(r[k]) for r in rest] == \
            pytest.approx(losses, rel=1e-9)
        mine = group.member_state(k)
        assert all(close(mine[n], v) for n, v in state.items() if v.is_floating_point())


def test_single_precision_agrees_within_float_tolerance() -> None:
    make, batches = no_dropout("resnet18"), data("resnet18")
    group = FusedGroup(make, MEMBERS)
    fused = [group.step(x, y).tolist() for x, y in batches]
    for k, m in enumerate(MEMBERS):
        losses, _ = separate(make, m, batches)
        assert [row[k] for row in fused] == pytest.approx(losses, rel=1e-3)


def test_a_nan_member_is_masked_and_the_others_go_on(float64: None) -> None:
    make, batches = no_dropout("bert_tiny"), data("bert_tiny")
    group = FusedGroup(make, MEMBERS)
    first = group.step(*batches[0])
    assert torch.isfinite(first).all()
    # Member t1's weights turn NaN (a blown-up update, a bad batch): it alone stops.
    name = next(iter(group.params))
    group.params[name][1].fill_(math.nan)
    rest = [group.step(x, y) for x, y in batches[1:]]
    assert group.diverged == ["t1"] and all(math.isnan(float(r[1])) for r in rest)
    for k in (0, 2, 3):
        losses, state = separate(make, MEMBERS[k], batches)
        assert [float(first[k])] + [float(r[k]) for r in rest] == \
            pytest.approx(losses, rel=1e-9)
        mine = group.member_state(k)
        assert all(close(mine[n], v) for n, v in state.items() if v.is_floating_point())
    # Its other parameters kept their last finite values: it stopped, it did not spread.
    other = list(group.params)[1]
    assert torch.isfinite(group.params[other][1]).all()


def test_a_diverged_members_batch_norm_statistics_stay_as_they_were(float64: None) -> None:
    """Its running statistics are put back after the step it diverged in and every
    later one (it still rides along in the vmapped pass); the others' keep moving."""
    make, batches = no_dropout("resnet18"), data("resnet18")
    group = FusedGroup(make, MEMBERS[:2])
    group.step(*batches[0])
    kept = {n: t[1].clone() for n, t in group.buffers.items()}
    moving = {n: t[0].clone() for n, t in group.buffers.items()}
    name = next(iter(group.params))
    group.params[name][1].fill_(math.nan)
    for x, y in batches[1:]:
        group.step(x, y)
    assert group.diverged == ["t1"]
    assert all(torch.equal(group.buffers[n][1], v) for n, v in kept.items())
    stats = [n for n in kept if "running_mean" in n]
    assert stats and all(not torch.equal(group.buffers[n][0], moving[n]) for n in stats)


def test_members_stop_alone_and_evaluate_like_separate_models(float64: None) -> None:
    make, batches = no_dropout("resnet18"), data("resnet18")
    group = FusedGroup(make, MEMBERS[:3])
    group.step(*batches[0])
    group.stop("t1")  # an early-stopped or cancelled member: the group goes on
    for x, y in batches[1:]:
        losses = group.step(x, y)
        assert math.isnan(float(losses[1])) and torch.isfinite(losses[[0, 2]]).all()
    assert group.running == ["t0", "t2"] and group.diverged == [] and group.stopped == {"t1"}
    x, y = batches[0]
    fused = group.evaluate(x, y)
    for k in (0, 2):
        _, state = separate(make, MEMBERS[k], batches)
        torch.manual_seed(0)
        model = make()
        model.load_state_dict(state)
        model.eval()
        with torch.no_grad():
            logits = model(x)
        assert fused[k]["loss"] == pytest.approx(
            float(nn.functional.cross_entropy(logits, y)), rel=1e-9)
        assert fused[k]["accuracy"] == float((logits.argmax(-1) == y).double().mean())
    # The stopped member kept what it had learned by its one step.
    _, one_step = separate(make, MEMBERS[1], batches[:1])
    assert all(close(group.member_state(1)[n], v) for n, v in one_step.items()
               if v.is_floating_point())


@pytest.mark.parametrize(("name", "optimizer", "members"), [
    ("resnet18", "sgd", MEMBERS[:2]), ("bert_tiny", "adam", ADAM_MEMBERS[:2])])
def test_a_member_checkpoint_resumes_exactly_fused_or_alone(
        name: str, optimizer: str, members: list[Member], float64: None) -> None:
    """Paused at a rung and promoted: a member's checkpoint (model and optimizer state,
    torch.optim's layout) resumes it in another group, or alone in the plain trainer,
    with the next step exactly the step it would have taken."""
    make, batches = no_dropout(name), data(name)
    group = FusedGroup(make, members, optimizer=optimizer)
    for x, y in batches[:2]:
        group.step(x, y)
    saved = [group.member_checkpoint(k) for k in range(len(members))]
    # In another group: fresh members (other seeds), the checkpoints loaded (in reverse
    # order: slots are positions, not names).
    again = FusedGroup(make, [Member(m.trial_id, lr=m.lr, momentum=m.momentum,
                                     weight_decay=m.weight_decay, beta1=m.beta1,
                                     beta2=m.beta2, eps=m.eps, seed=9 + k,
                                     clip_norm=m.clip_norm)
                              for k, m in reversed(list(enumerate(members)))],
                       optimizer=optimizer)
    for slot, k in enumerate(reversed(range(len(members)))):
        again.load_member(slot, *saved[k])
    x, y = batches[2]
    group.step(x, y)
    again.step(x, y)
    for slot, k in enumerate(reversed(range(len(members)))):
        a, b = group.member_state(k), again.member_state(slot)
        assert all(close(a[n], b[n]) for n in a if a[n].is_floating_point())
    # Alone: a torch model and torch.optim optimizer from the same checkpoint.
    m = members[0]
    model = make().train()
    model.load_state_dict(saved[0][0])
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=m.lr, momentum=m.momentum, weight_decay=m.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=m.lr, betas=(m.beta1, m.beta2),
                               eps=m.eps, weight_decay=m.weight_decay)
    for p, state in zip(model.parameters(), saved[0][1].values(), strict=True):
        opt.state[p] = dict(state)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    if m.clip_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), m.clip_norm)
    opt.step()
    alone, fused = model.state_dict(), group.member_state(0)
    assert all(close(fused[n], alone[n]) for n in alone if alone[n].is_floating_point())
    with pytest.raises(ValueError, match="another model"):
        again.load_member(0, {"w": torch.zeros(1)}, {})
