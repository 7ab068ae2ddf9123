"""The model zoo: published sizes, shapes, and that each model learns."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hypersack.core.catalog import MODELS  # noqa: E402
from hypersack.core.errors import InvalidInput  # noqa: E402
from hypersack.runner import zoo  # noqa: E402


@pytest.mark.parametrize("name", sorted(zoo.BUILDERS))
def test_parameter_count_within_ten_percent_of_the_published_model(name: str) -> None:
    params = zoo.parameters(zoo.build(name)) / 1e6
    published = MODELS[name].params_millions
    assert abs(params - published) / published < 0.10, (name, params, published)


@pytest.mark.parametrize("name", sorted(zoo.BUILDERS))
def test_forward_and_backward_give_logits_and_gradients(name: str) -> None:
    torch.manual_seed(0)
    model = zoo.build(name)
    if name in zoo.VOCAB:
        x = torch.randint(3, 1000, (2, 24))
        x[1, 10:] = 0  # padding after a shorter review
        classes = 2
    else:
        x = torch.randn(2, 3, 32, 32)
        classes = 10
    out = model(x)
    assert out.shape == (2, classes) and torch.isfinite(out).all()
    out.sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert sum(g is not None and bool(g.abs().sum() > 0) for g in grads) > len(grads) * 0.8


def test_pythia_ignores_right_padding_and_trains_its_language_model_head() -> None:
    torch.manual_seed(0)
    model = zoo.build("pythia_14m").eval()
    ids = torch.randint(3, 5000, (1, 12))
    padded = torch.cat([ids, torch.zeros(1, 6, dtype=torch.long)], dim=1)
    assert torch.allclose(model(ids), model(padded), atol=1e-5)
    model(ids).sum().backward()
    head = model.embed_out.weight.grad  # type: ignore[union-attr]
    assert head is not None and bool(head[list(zoo.LABEL_TOKENS)].abs().sum() > 0)


def test_unknown_model_names_the_valid_ones() -> None:
    with pytest.raises(InvalidInput, match=r"no zoo model 'resnet99'; valid: .*shufflenet"):
        zoo.build("resnet99")
