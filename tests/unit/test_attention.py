"""Attention in fused groups without vmap's per-member fallback: the batched formula
equals PyTorch's fused attention, the zoo's transformers train and evaluate in a fused
group with no fallback warning, and the switch is undone on the way out."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional


def _qkv(length: int, source: int) -> tuple:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(2, 3, n, 8, generator=g, dtype=torch.float64)
                 for n in (length, source, source))


@pytest.mark.parametrize("case", ["plain", "causal", "bool mask", "float mask", "scale",
                                  "gqa"])
def test_the_batched_formula_equals_pytorch_attention(case: str) -> None:
    from hypersack.runner.attention import math_attention

    q, k, v = _qkv(5, 5 if case in ("causal", "gqa") else 7)
    g = torch.Generator().manual_seed(1)
    kw: dict = {"plain": {}, "causal": {"is_causal": True},
                "bool mask": {"attn_mask": torch.rand(5, 7, generator=g) > 0.3},
                "float mask": {"attn_mask": torch.randn(2, 1, 5, 7, generator=g,
                                                        dtype=torch.float64)},
                "scale": {"scale": 0.3}, "gqa": {"enable_gqa": True}}[case]
    if case == "gqa":
        k, v = k[:, :1], v[:, :1]
    want = F.scaled_dot_product_attention(q, k, v, **kw)
    got = math_attention(q, k, v, **kw)
    assert float((want - got).abs().max()) <= 1e-12


@pytest.mark.parametrize("name", ["bert_tiny", "vit_tiny", "pythia_14m"])
def test_a_fused_transformer_runs_attention_batched(name: str) -> None:
    from hypersack.runner import zoo
    from hypersack.runner.fused import FusedGroup, Member

    group = FusedGroup(lambda: zoo.build(name), [Member("a", lr=0.01, seed=0),
                                                  Member("b", lr=0.02, seed=1)])
    if name == "vit_tiny":
        x = torch.randn(2, 3, 32, 32)
        y = torch.randint(0, 10, (2,))
    else:
        x, y = torch.randint(1, 1000, (2, 12)), torch.randint(0, 2, (2,))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*batching rule.*")
        losses = group.step(x, y)
        group.evaluate(x, y)
    assert torch.isfinite(losses).all()


def test_the_switch_is_undone_even_after_an_error() -> None:
    from hypersack.runner.attention import batched_attention, math_attention

    original = F.scaled_dot_product_attention
    with pytest.raises(RuntimeError), batched_attention():
        assert F.scaled_dot_product_attention is math_attention
        assert not torch.backends.mha.get_fastpath_enabled()
        raise RuntimeError("a step failed")
    assert F.scaled_dot_product_attention is original
    assert torch.backends.mha.get_fastpath_enabled()
