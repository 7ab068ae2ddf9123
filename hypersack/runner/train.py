"""Built-in `train` workload: trains the trial's model and reports loss per epoch.

The nine zoo models train with PyTorch (`hypersack.runner.torch_train`; install the
`torch` extra on GPU nodes). `digits_mlp` trains with NumPy alone, on the bundled UCI
digits, so the whole system runs real trials on any machine: the quick start.

Hyperparameters (the trial's params): `lr`, `batch_size`, `momentum`,
`weight_decay`, `seed` (the model's initialisation; the data order follows
`options.seed`), and `optimizer` (sgd, adam, adamw) and `precision` (fp32, bf16, fp16)
for the zoo. Options: `hypersack.core.train_options.TrainOptions`. Each epoch reports
`loss` (validation cross-entropy, the default objective), `accuracy`, `train_loss`,
`iter_time_s` and `data_fraction` (share of each iteration spent loading data).
"""

from __future__ import annotations

import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from hypersack import __version__
from hypersack.core import optim
from hypersack.core.catalog import MODELS
from hypersack.core.errors import HyperSackError
from hypersack.core.train_options import TrainOptions, parse_train_options, trial_seed
from hypersack.runner import datasets, sdk
from hypersack.runner.loop import Epochs
from hypersack.runner.sdk import checkpoint_path, save_checkpoint


def train_mlp(params: dict[str, Any], epochs: float, opts: TrainOptions) -> float:
    """A 64-64-10 perceptron with ReLU, trained by mini-batch SGD with momentum."""
    for name, only in (("optimizer", "sgd"), ("precision", "fp32")):
        if str(params.get(name, only)) != only:
            # Refused rather than ignored: an 'adam' trial must not quietly be SGD.
            raise HyperSackError(f"digits_mlp trains with NumPy {only} only, not {name} "
                                 f"{str(params[name])[:40]!r} (the PyTorch models take it)")
    # SGD's hyperparameters checked as the PyTorch trainer's are (its defaults differ).
    sgd = optim.hyperparameters("sgd", {"lr": 0.1, "momentum": 0.0, **params})
    lr, momentum, decay = sgd["lr"], sgd["momentum"], sgd["weight_decay"]
    data = datasets.load("digits_mlp", opts)
    batch = int(params.get("batch_size", 32))
    rng = np.random.default_rng(opts.seed)  # the data order
    seed = trial_seed(opts.seed, params)  # the weights' (one stream with no seed param)
    init = rng if seed == opts.seed else np.random.default_rng(seed)
    w1 = init.normal(0, math.sqrt(2 / 64), (64, 64)).astype(np.float32)
    w2 = init.normal(0, math.sqrt(1 / 64), (64, 10)).astype(np.float32)
    b1, b2 = np.zeros(64, np.float32), np.zeros(10, np.float32)
    weights = [w1, b1, w2, b2]
    velocity = [np.zeros_like(w) for w in weights]
    sdk.set_profile_info(versions=f"hypersack={__version__} numpy={np.__version__}")

    def forward(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        h = np.maximum(x @ w1 + b1, 0)
        z = h @ w2 + b2
        z = z - z.max(axis=1, keepdims=True)
        p = np.exp(z)
        return h, p / p.sum(axis=1, keepdims=True)

    def evaluate() -> tuple[float, float]:
        _, p = forward(data.val.x)
        loss = -np.log(p[np.arange(len(data.val.y)), data.val.y] + 1e-12).mean()
        return float(loss), float((p.argmax(axis=1) == data.val.y).mean())

    ep = Epochs(data.train.size, batch, epochs, rng)
    saved = checkpoint_path(".npz")
    if saved is not None and saved.exists():
        with np.load(saved) as state:
            ep.resume(int(state["arr_0"]))
            rng.bit_generator.state = json.loads(str(state["arr_1"]))
            for k, w in enumerate([*weights, *velocity]):
                w[...] = state[f"arr_{k + 2}"]
        print(f"resumed from {saved} after epoch {ep.start // ep.iters_per_epoch}",
              flush=True)
    loss = math.inf
    loss_sum = 0.0
    for i in range(ep.start, ep.total):
        t0 = time.perf_counter()
        x, y = data.train.batch(ep.indices(i))
        t1 = time.perf_counter()
        h, p = forward(x)
        loss_sum += float(-np.log(p[np.arange(len(y)), y] + 1e-12).mean())
        dz = p
        dz[np.arange(len(y)), y] -= 1
        dz /= len(y)
        dh = (dz @ w2.T) * (h > 0)
        grads = [x.T @ dh, dh.sum(axis=0), h.T @ dz, dz.sum(axis=0)]
        for w, v, g in zip(weights, velocity, grads, strict=True):
            v *= momentum
            v += g + decay * w
            w -= lr * v
        epoch = ep.done(i, t1 - t0, time.perf_counter() - t1)
        if epoch is not None:
            train_loss = loss_sum / ep.steps
            loss, acc = evaluate()
            loss_sum = 0.0
            if not ep.report(epoch, loss, acc, train_loss):
                break
            if ep.pause(epoch):
                arrays = [np.array(epoch), np.array(json.dumps(rng.bit_generator.state)),
                          *weights, *velocity]
                save_checkpoint(".npz", functools.partial(_savez, arrays=arrays))
                break
    return loss


def _savez(path: Path, arrays: list[np.ndarray]) -> None:
    """The epoch, the shuffling generator's state, the weights and their velocities."""
    with open(path, "wb") as f:
        np.savez(f, *arrays)


def main() -> None:
    params = sdk.params()
    model = str(params.get("model", "digits_mlp"))
    try:
        if model not in MODELS:
            raise HyperSackError(f"unknown model {model!r}; valid: {', '.join(sorted(MODELS))}")
        opts = parse_train_options(sdk.options())
        if not MODELS[model].needs_torch:
            train_mlp(params, sdk.epochs(), opts)
            return
        try:
            from hypersack.runner import torch_train
        except ImportError as exc:
            if exc.name != "torch":
                raise
            raise HyperSackError(
                f"{model} trains with PyTorch, which is not installed on this node: install "
                "it with pip install 'hypersack[torch]' (or a torch build for your CUDA)"
            ) from None
        torch_train.train(model, params, sdk.epochs(), opts)
    except HyperSackError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
