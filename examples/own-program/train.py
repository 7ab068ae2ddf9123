"""A small training program of its own (not a zoo model): a two-layer NumPy perceptron
on a synthetic spiral, trained with mini-batch SGD. It reads its hyperparameters from
its arguments and reports a validation metric each epoch with the HyperSack SDK.

    python train.py --lr 0.1 --width 64 --epochs 6      # runs alone too
"""

from __future__ import annotations

import argparse

import numpy as np

import hypersack
from hypersack.runner import sdk


def spiral(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Three interleaved arms, n points each: not linearly separable."""
    xs, ys = [], []
    for arm in range(3):
        r = np.linspace(0.05, 1.0, n)
        t = np.linspace(arm * 4.2, (arm + 1) * 4.2, n) + rng.normal(0, 0.25, n)
        xs.append(np.stack([r * np.sin(t), r * np.cos(t)], axis=1))
        ys.append(np.full(n, arm))
    x, y = np.concatenate(xs), np.concatenate(ys)
    order = rng.permutation(len(y))
    return x[order].astype(np.float32), y[order]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    x, y = spiral(300, rng)
    split = int(0.8 * len(y))
    (xt, yt), (xv, yv) = (x[:split], y[:split]), (x[split:], y[split:])
    w1 = rng.normal(0, 1.0, (2, args.width)).astype(np.float32)
    b1 = np.zeros(args.width, np.float32)
    w2 = rng.normal(0, 1.0 / np.sqrt(args.width), (args.width, 3)).astype(np.float32)
    b2 = np.zeros(3, np.float32)

    def forward(inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        hidden = np.maximum(0, inputs @ w1 + b1)
        logits = hidden @ w2 + b2
        logits -= logits.max(axis=1, keepdims=True)
        prob = np.exp(logits)
        return hidden, prob / prob.sum(axis=1, keepdims=True)

    batches = int(np.ceil(split / args.batch_size))
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(split)
        for i in range(batches):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            hidden, prob = forward(xt[idx])
            grad = prob
            grad[np.arange(len(idx)), yt[idx]] -= 1
            grad /= len(idx)
            dh = (grad @ w2.T) * (hidden > 0)
            w2 -= args.lr * hidden.T @ grad
            b2 -= args.lr * grad.sum(axis=0)
            w1 -= args.lr * xt[idx].T @ dh
            b1 -= args.lr * dh.sum(axis=0)
            sdk.iteration(iters_per_epoch=batches)  # lets HyperSack time this program
        _, prob = forward(xv)
        val_loss = float(-np.log(prob[np.arange(len(yv)), yv] + 1e-9).mean())
        val_acc = float((prob.argmax(axis=1) == yv).mean())
        hypersack.report(step=epoch, val_loss=val_loss, val_acc=val_acc)
        print(f"epoch {epoch}: val_loss {val_loss:.4f} val_acc {val_acc:.3f}", flush=True)


if __name__ == "__main__":
    main()
