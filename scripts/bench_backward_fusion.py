"""Step time of the built-in trainer's two loops on this machine: the standard one (one
optimizer step after backward) against optimizer steps fused into the backward pass
(`program.options.optimizer_fusion: backward`), per zoo model and optimizer, as the
ratio fused / standard measured in the same run (rounds alternate, the median is kept).

    python scripts/bench_backward_fusion.py
    python scripts/bench_backward_fusion.py --models resnet18 --optimizers adam --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypersack.core.train_options import TrainOptions
from hypersack.runner import zoo
from hypersack.runner.torch_train import Stepper


def _batch(model: str, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    vocab = zoo.VOCAB.get(model, 0)
    if vocab:
        return (torch.randint(0, vocab, (batch, 128), generator=g),
                torch.randint(0, 2, (batch,), generator=g))
    return (torch.randn(batch, 3, 32, 32, generator=g),
            torch.randint(0, 10, (batch,), generator=g))


def step_time(model_name: str, optimizer: str, fusion: str, batch: int, steps: int) -> float:
    """Median seconds per training step (forward, backward, update)."""
    torch.manual_seed(0)
    model = zoo.build(model_name).train()
    params: dict[str, Any] = {"optimizer": optimizer, "lr": 1e-3}
    stepper = Stepper(model, params, TrainOptions(optimizer_fusion=fusion),  # type: ignore[arg-type]
                      torch.amp.GradScaler("cpu", enabled=False))
    x, y = _batch(model_name, batch)
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        stepper.step(nn.functional.cross_entropy(model(x), y))
        if i >= 2:  # two warm-up steps
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="resnet18,mobilenet_v2,bert_tiny")
    ap.add_argument("--optimizers", default="sgd,adam")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1: a trial sharing a node's cores)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), batch {args.batch}, "
          f"median of {args.steps} steps, best round of {args.rounds}")
    print(f"{'model':<14}{'optimizer':<10}{'standard ms':>12}{'backward ms':>13}"
          f"{'ratio':>8}")
    for model in args.models.split(","):
        for opt in args.optimizers.split(","):
            std, bwd = [], []
            for _ in range(args.rounds):  # alternating: drift hits both the same
                std.append(step_time(model, opt, "none", args.batch, args.steps))
                bwd.append(step_time(model, opt, "backward", args.batch, args.steps))
            s, b = min(std), min(bwd)
            print(f"{model:<14}{opt:<10}{1000 * s:>12.1f}{1000 * b:>13.1f}{b / s:>8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
