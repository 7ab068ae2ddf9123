"""A fused group's forward-backward pass compiled by torch.compile trains exactly as the
eager one: the same losses and members' weights after several steps in float64, with
BatchNorm's running statistics, a clipped member, Adam, and a member that diverges
mid-run (masked, the others unchanged). On a GPU the compiled pass is the remedy for
vmap's host cost (docs/gpu.md); here it is checked for equality on the CPU with a small
model, so the compile stays short."""

from __future__ import annotations

import math
import shutil
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from torch import nn  # noqa: E402

from hypersack.runner.fused import FusedGroup, Member  # noqa: E402

# torch.compile's CPU code generator builds C++.
pytestmark = pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                                reason="torch.compile on the CPU needs a C++ compiler")

MEMBERS = [Member("c0", lr=0.05, momentum=0.9, seed=0),
           Member("c1", lr=0.02, weight_decay=1e-3, seed=1, clip_norm=0.3),
           Member("c2", lr=0.1, momentum=0.5, seed=2)]


@pytest.fixture
def float64() -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def small() -> nn.Module:
    # No bias before BatchNorm: its gradient is zero but for rounding, which Adam would
    # scale up to whole steps, and two orders of the same sums would then differ.
    return nn.Sequential(nn.Linear(6, 12, bias=False), nn.BatchNorm1d(12), nn.ReLU(),
                         nn.Linear(12, 3))


def batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(5)
    return [(torch.randn(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(n)]


def train(group: FusedGroup, data: list[tuple[torch.Tensor, torch.Tensor]],
          poison_at: int | None = None) -> list[list[float]]:
    out = []
    for i, (x, y) in enumerate(data):
        if i == poison_at:  # member 1's weights made NaN: it diverges at this step
            with torch.no_grad():
                group.params["0.weight"][1].fill_(math.nan)
        out.append(group.step(x, y).tolist())
    return out


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_compiled_pass_trains_as_the_eager_one(optimizer: str, float64: None) -> None:
    torch._dynamo.reset()
    data = batches(4)
    eager = FusedGroup(small, MEMBERS, optimizer=optimizer)
    compiled = FusedGroup(small, MEMBERS, optimizer=optimizer, compile="default")
    assert compiled._pass is not compiled._forward_backward  # really compiled
    a, b = train(eager, data, poison_at=2), train(compiled, data, poison_at=2)
    for row_a, row_b in zip(a, b, strict=True):
        assert row_b == pytest.approx(row_a, rel=1e-9, nan_ok=True)
    assert math.isnan(a[-1][1]) and compiled.diverged == eager.diverged == ["c1"]
    for k in (0, 2):  # the live members, weights and BatchNorm statistics
        mine, theirs = compiled.member_state(k), eager.member_state(k)
        for key, value in theirs.items():
            if value.is_floating_point():
                assert torch.allclose(mine[key], value, rtol=1e-9, atol=1e-12), key
