"""Options of the built-in `train` program (a study's `program.options`), checked by the
server at submission and read again by the trial process. Imports nothing heavy:
the server checks them without the runner."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hypersack.core.catalog import MODELS
from hypersack.core.errors import InvalidInput
from hypersack.core.validation import format_validation_error

ENV_DATA_DIR = "HYPERSACK_DATA_DIR"
DATASETS = ("cifar10", "imdb", "digits", "synthetic")


class TrainOptions(BaseModel):
    """`dataset`: the model's own (cifar10, imdb, digits) when not given; `synthetic`
    only when asked for by name. `data_dir`: where the datasets lie on each node
    (default `$HYPERSACK_DATA_DIR`, else `~/.hypersack/data`). `train_samples` and
    `val_samples` cap the splits (a short trial); `seq_len` is the IMDB review length
    in tokens; `seed` fixes initialisation, shuffling and augmentation."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset: Literal["cifar10", "imdb", "digits", "synthetic"] | None = None
    data_dir: str | None = None
    train_samples: int | None = Field(default=None, gt=0)
    val_samples: int | None = Field(default=None, gt=0)
    seq_len: int = Field(default=256, ge=8, le=2048)
    seed: int = 0
    augment: bool = True  # random crop and flip for 32x32 images

    def data_path(self) -> Path:
        raw = self.data_dir or os.environ.get(ENV_DATA_DIR) or "~/.hypersack/data"
        return Path(raw).expanduser()


def parse_train_options(options: dict[str, Any], where: str = "program.options") -> TrainOptions:
    try:
        return TrainOptions.model_validate(options)
    except ValidationError as exc:
        raise InvalidInput(format_validation_error(exc, where)) from None


def dataset_for(model: str, opts: TrainOptions) -> str:
    info = MODELS[model]
    name = opts.dataset or info.dataset
    if name not in ("synthetic", info.dataset):
        raise InvalidInput(f"model {model} trains on {info.dataset} (or synthetic), "
                           f"not {name}")
    return name
