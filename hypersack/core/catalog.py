"""The built-in workloads: the nine models of the HyperSack paper's search spaces, and a
small NumPy model for the quick start."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ModelInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    dataset: str
    family: str
    params_millions: float
    samples_per_epoch: int
    needs_torch: bool = True  # False: trains with NumPy alone


_CIFAR = 50_000
_IMDB = 25_000

MODELS: dict[str, ModelInfo] = {
    m.name: m
    for m in (
        ModelInfo(name="shufflenet", dataset="cifar10", family="cnn", params_millions=1.3,
                  samples_per_epoch=_CIFAR),
        ModelInfo(name="mobilenet_v2", dataset="cifar10", family="cnn", params_millions=2.3,
                  samples_per_epoch=_CIFAR),
        ModelInfo(name="vit_tiny", dataset="cifar10", family="vit", params_millions=5.5,
                  samples_per_epoch=_CIFAR),
        ModelInfo(name="deit_tiny", dataset="cifar10", family="vit", params_millions=5.5,
                  samples_per_epoch=_CIFAR),
        ModelInfo(name="resnet18", dataset="cifar10", family="cnn", params_millions=11.2,
                  samples_per_epoch=_CIFAR),
        ModelInfo(name="resnet34", dataset="cifar10", family="cnn", params_millions=21.3,
                  samples_per_epoch=_CIFAR),
        ModelInfo(name="bert_tiny", dataset="imdb", family="transformer", params_millions=4.4,
                  samples_per_epoch=_IMDB),
        ModelInfo(name="pythia_14m", dataset="imdb", family="decoder", params_millions=14.0,
                  samples_per_epoch=_IMDB),
        ModelInfo(name="pythia_31m", dataset="imdb", family="decoder", params_millions=31.0,
                  samples_per_epoch=_IMDB),
        # Not from the paper: a small perceptron trained with NumPy on the bundled UCI
        # handwritten digits, so the whole system runs real trials on any machine with no
        # download and no torch (the quick start).
        ModelInfo(name="digits_mlp", dataset="digits", family="mlp",
                  params_millions=0.00481, samples_per_epoch=1437, needs_torch=False),
    )
}
