"""Options of the built-in `train` program (a study's `program.options`), checked by the
server at submission and read again by the trial process. Imports nothing heavy:
the server checks them without the runner."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from hypersack.core.catalog import MODELS
from hypersack.core.errors import InvalidInput
from hypersack.core.validation import format_validation_error

ENV_DATA_DIR = "HYPERSACK_DATA_DIR"
DATASETS = ("cifar10", "imdb", "digits", "synthetic")
# The built-in trainer's precisions (runner/amp.py's autocast types), plain and fused.
PRECISIONS = ("fp32", "bf16", "fp16")
# The largest seed (torch.manual_seed takes less than 2**64; a fused profile's members
# are seeded seed + k).
MAX_SEED = 2**62


class TrainOptions(BaseModel):
    """`dataset`: the model's own (cifar10, imdb, digits) when not given; `synthetic`
    only when asked for by name. `data_dir`: where the datasets lie on each node
    (default `$HYPERSACK_DATA_DIR`, else `~/.hypersack/data`). `train_samples` and
    `val_samples` cap the splits (a short trial); `seq_len` is the IMDB review length
    in tokens; `seed` fixes initialisation, shuffling and augmentation (a trial's
    `seed` hyperparameter, where the space has one, seeds its initialisation instead:
    `trial_seed`).

    `optimizer_fusion: backward` updates each parameter from a hook as soon as its
    gradient is final in the backward pass (the optimizer-fusion paper's backward
    fusion), instead of one optimizer step after it; `none` (the default) is the
    standard loop. `clip_grad_norm` rescales all gradients so their global norm is at
    most the value (`torch.nn.utils.clip_grad_norm_`); `clip_grad_value` clamps each
    gradient element to [-value, value] (`clip_grad_value_`). A global norm needs every
    gradient before any update, so backward fusion takes `clip_grad_value` only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: Literal["cifar10", "imdb", "digits", "synthetic"] | None = None
    data_dir: str | None = None
    train_samples: int | None = Field(default=None, gt=0)
    val_samples: int | None = Field(default=None, gt=0)
    seq_len: int = Field(default=256, ge=8, le=2048)
    seed: int = Field(default=0, ge=0, le=MAX_SEED)
    augment: bool = True  # random crop and flip for 32x32 images
    optimizer_fusion: Literal["none", "backward"] = "none"
    clip_grad_norm: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    clip_grad_value: float | None = Field(default=None, gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_clipping(self) -> TrainOptions:
        if self.clip_grad_norm is not None and self.clip_grad_value is not None:
            raise ValueError("clip_grad_norm and clip_grad_value: one clipping mode at a "
                             "time")
        if self.optimizer_fusion == "backward" and self.clip_grad_norm is not None:
            raise ValueError(
                "optimizer_fusion: backward updates each parameter as soon as its gradient "
                "is final, before the others exist, so a global norm (clip_grad_norm) "
                "cannot be taken; use clip_grad_value (per element), or "
                "optimizer_fusion: none")
        return self

    def torch_only(self) -> list[str]:
        """The options set here that only the PyTorch trainer has."""
        return [name for name, default in (("optimizer_fusion", "none"),
                                           ("clip_grad_norm", None),
                                           ("clip_grad_value", None))
                if getattr(self, name) != default]

    def data_path(self) -> Path:
        raw = self.data_dir or os.environ.get(ENV_DATA_DIR) or "~/.hypersack/data"
        return Path(raw).expanduser()


def parse_train_options(options: dict[str, Any], where: str = "program.options") -> TrainOptions:
    try:
        return TrainOptions.model_validate(options)
    except ValidationError as exc:
        raise InvalidInput(format_validation_error(exc, where)) from None


def check_seed(value: Any, where: str = "seed") -> int:
    """A seed as the trainers take it: an integer (an integral float too) from 0 to
    MAX_SEED; InvalidInput naming `where` otherwise (a boolean is no seed)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not value.is_integer()) or \
            not 0 <= value <= MAX_SEED:
        raise InvalidInput(f"{where}: an integer from 0 to 2**62 expected, got "
                           f"{str(value)[:40]!r}")
    return int(value)


def trial_seed(options_seed: Any, params: Mapping[str, Any]) -> int:
    """The one rule for the seed of a built-in trial's model initialisation, plain or
    fused: its `seed` hyperparameter where it has one, else the program's
    `options.seed`. The data order (shuffling, augmentation) follows `options.seed`
    alone: a fused group's members train on the same batches, and a trial trains alike
    fused or not."""
    if "seed" in params:
        return check_seed(params["seed"])
    return check_seed(options_seed, "program.options.seed")


def dataset_for(model: str, opts: TrainOptions) -> str:
    info = MODELS[model]
    name = opts.dataset or info.dataset
    if name not in ("synthetic", info.dataset):
        raise InvalidInput(f"model {model} trains on {info.dataset} (or synthetic), "
                           f"not {name}")
    return name
