"""Whether the built-in trainer can run a search space: checked where a study is submitted
and by `hypersack validate`, before any trial starts."""

from __future__ import annotations

from hypersack.core.catalog import MODELS
from hypersack.core.errors import InvalidInput
from hypersack.core.train_options import dataset_for, parse_train_options
from hypersack.grid.space import SearchSpace


def check_runnable(space: SearchSpace, source: str) -> None:
    """A study the built-in trainer can run: valid options, and a dataset each model
    trains on. Whether a node can train a model (torch, the dataset on its disk) shows
    when the model is profiled there: a profile that fails fails its trials."""
    if space.program.builtin == "train":
        opts = parse_train_options(space.program.options, f"{source}: program.options")
        numpy_models = [m for m in space.models if m in MODELS and not MODELS[m].needs_torch]
        if opts.torch_only() and numpy_models:
            raise InvalidInput(
                f"{source}: program.options: {', '.join(opts.torch_only())} apply to the "
                f"PyTorch models only; {', '.join(numpy_models)} trains with NumPy")
        for model in space.models:
            try:
                dataset_for(model, opts)
            except InvalidInput as exc:
                raise InvalidInput(f"{source}: program.options.dataset: {exc}") from None
