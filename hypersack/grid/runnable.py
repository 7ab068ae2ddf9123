"""Whether the built-in trainer can run a search space: checked where a study is submitted
and by `hypersack validate`, before any trial starts."""

from __future__ import annotations

from hypersack.core.catalog import MODELS
from hypersack.core.errors import InvalidInput
from hypersack.core.train_options import (
    PRECISIONS,
    check_seed,
    dataset_for,
    parse_train_options,
)
from hypersack.grid.params import Choice, IntRange
from hypersack.grid.space import SearchSpace


def check_runnable(space: SearchSpace, source: str) -> None:
    """A study the built-in trainer can run: valid options, and a dataset each model
    trains on. Whether a node can train a model (torch, the dataset on its disk) shows
    when the model is profiled there: a profile that fails fails its trials."""
    if space.program.builtin == "train":
        opts = parse_train_options(space.program.options, f"{source}: program.options")
        numpy_models = [m for m in space.models if m in MODELS and not MODELS[m].needs_torch]
        torch_only = opts.torch_only()
        if torch_only and numpy_models:
            verb = "applies" if len(torch_only) == 1 else "apply"
            raise InvalidInput(
                f"{source}: program.options: {', '.join(torch_only)} {verb} to the "
                f"PyTorch models only; {', '.join(numpy_models)} trains with NumPy")
        for model in space.models:
            try:
                dataset_for(model, opts)
            except InvalidInput as exc:
                raise InvalidInput(f"{source}: program.options.dataset: {exc}") from None
        _check_seeds(space, source)
        precisions = _values(space, "precision", "fp32")
        bad = [p for p in precisions if p not in PRECISIONS]
        if bad:
            raise InvalidInput(f"{source}: hyperparameters.precision: the built-in trainer "
                               f"has no {bad[0][:40]!r}; valid: {', '.join(PRECISIONS)}")
        if opts.optimizer_fusion == "backward" and "fp16" in precisions:
            raise InvalidInput(
                f"{source}: program.options.optimizer_fusion: backward does not take "
                "precision fp16 (its loss scale skips a step from every gradient's "
                "overflow, after the backward pass); use bf16 or fp32, or "
                "optimizer_fusion: none")
        for name, only in (("precision", "fp32"), ("optimizer", "sgd")):
            other = [v for v in _values(space, name, only) if v != only]
            if other and numpy_models:
                # Every model meets every value (a key hyperparameter takes no `when`):
                # each such trial would fail as it starts.
                raise InvalidInput(
                    f"{source}: hyperparameters.{name}: {', '.join(numpy_models)} trains "
                    f"with NumPy {only} only, not {other[0][:40]!r}; search the PyTorch "
                    "models in a study of their own")


def _check_seeds(space: SearchSpace, source: str) -> None:
    """A `seed` hyperparameter seeds each trial (train_options.trial_seed): integers
    from 0 to 2**62 only, a choice or an int range (a float range would give every
    trial a seed that fails as it starts)."""
    hp = space.hyperparameters.get("seed")
    where = f"{source}: hyperparameters.seed"
    if hp is None:
        return
    if isinstance(hp, Choice):
        for v in hp.values:
            check_seed(v, where)
    elif isinstance(hp, IntRange):
        check_seed(hp.low, where)
        check_seed(hp.high, where)
    else:
        raise InvalidInput(f"{where}: a seed is an integer: a choice of integers or an "
                           f"int range, not {hp.distribution}")


def _values(space: SearchSpace, name: str, default: str) -> list[str]:
    """The values a key hyperparameter takes (its default where the space has none)."""
    hp = space.hyperparameters.get(name)
    if isinstance(hp, Choice):
        return [str(v) for v in hp.values]
    return [default]
