"""Helpers for tests that compare fused groups with separate runs (imports torch)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn


def without_dropout(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """`build`, with every dropout off: a fused group draws one mask over its stacked
    tensors, another random stream than separate runs', so only dropout-free runs compare."""
    def make() -> nn.Module:
        model = build()
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
            if isinstance(m, nn.MultiheadAttention):
                m.dropout = 0.0
        return model
    return make
