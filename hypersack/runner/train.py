"""Built-in `train` workload: trains the trial's model and reports loss per epoch.

This installation trains the pure-Python `linreg` model (linear regression by
mini-batch SGD on a fixed synthetic dataset: 4,096 training and 1,024 validation
samples, 32 features). It uses one CPU core and no GPU, so the whole system runs real
trials anywhere. Hyperparameters: `lr` (default 0.01), `batch_size`, `momentum`
(default 0), `weight_decay` (default 0). Reports `loss` (validation mean squared
error, the default objective) and `train_loss` after every epoch.
"""

from __future__ import annotations

import math
import random
import sys
import time

from hypersack.runner import builtin_trainable, sdk

FEATURES = 32
TRAIN = 4096
VALID = 1024


Rows = list[list[float]]


def dataset(seed: int = 0) -> tuple[Rows, list[float], Rows, list[float]]:
    rng = random.Random(seed)
    w = [rng.gauss(0, 1) for _ in range(FEATURES)]
    # Features on scales from 0.05 to 2: ill-conditioned, so the learning rate and
    # momentum matter (too large diverges, too small stays far from the optimum).
    scale = [0.05 * (40 ** (k / (FEATURES - 1))) for k in range(FEATURES)]

    def sample() -> tuple[list[float], float]:
        x = [rng.gauss(0, s) for s in scale]
        return x, sum(a * b for a, b in zip(w, x, strict=False)) + rng.gauss(0, 0.1)

    train = [sample() for _ in range(TRAIN)]
    valid = [sample() for _ in range(VALID)]
    return ([x for x, _ in train], [y for _, y in train],
            [x for x, _ in valid], [y for _, y in valid])


def mse(w: list[float], xs: list[list[float]], ys: list[float]) -> float:
    total = 0.0
    for x, y in zip(xs, ys, strict=False):
        err = sum(a * b for a, b in zip(w, x, strict=False)) - y
        total += err * err
        if not math.isfinite(total):
            return math.inf
    return total / len(xs)


def train_linreg(lr: float, batch_size: int, epochs: float, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> float:
    t0 = time.perf_counter()
    xs, ys, vx, vy = dataset()
    data_s = time.perf_counter() - t0
    w = [0.0] * FEATURES
    velocity = [0.0] * FEATURES
    iters_per_epoch = math.ceil(TRAIN / batch_size)
    total = max(1, round(epochs * iters_per_epoch))
    order = list(range(TRAIN))
    rng = random.Random(1)
    loss = math.inf
    for i in range(total):
        pos = (i % iters_per_epoch) * batch_size
        if pos == 0:
            rng.shuffle(order)
        batch = order[pos:pos + batch_size]
        grad = [0.0] * FEATURES
        for j in batch:
            x = xs[j]
            err = sum(a * b for a, b in zip(w, x, strict=False)) - ys[j]
            for k in range(FEATURES):
                grad[k] += err * x[k]
        scale = 2.0 / len(batch)
        for k in range(FEATURES):
            g = grad[k] * scale + weight_decay * w[k]
            velocity[k] = momentum * velocity[k] + g
            w[k] -= lr * velocity[k]
        sdk.iteration(data_s=data_s if i == 0 else 0.0, iters_per_epoch=iters_per_epoch)
        if (i + 1) % iters_per_epoch == 0 or i + 1 == total:
            epoch = math.ceil((i + 1) / iters_per_epoch)
            loss = mse(w, vx, vy)
            train_loss = mse(w, xs[:VALID], ys[:VALID])
            sdk.report(step=epoch, loss=sdk.finite(loss), train_loss=sdk.finite(train_loss),
                       epoch=epoch)
            print(f"epoch {epoch}: loss {loss:.6g} train_loss {train_loss:.6g}", flush=True)
            if not math.isfinite(loss):
                print("diverged; stopping", flush=True)
                break
    return loss


def main() -> None:
    params = sdk.params()
    model = str(params.get("model", "linreg"))
    if model not in builtin_trainable():
        print(f"error: the built-in train program cannot train {model!r} in this "
              f"installation (it trains: {', '.join(sorted(builtin_trainable()))})",
              file=sys.stderr)
        sys.exit(2)
    train_linreg(lr=float(params.get("lr", 0.01)), batch_size=int(params.get("batch_size", 64)),
                 epochs=sdk.epochs(), momentum=float(params.get("momentum", 0.0)),
                 weight_decay=float(params.get("weight_decay", 0.0)))


if __name__ == "__main__":
    main()
