"""Step time of the built-in trainer's two loops on this machine: the standard one (one
optimizer step after backward) against optimizer steps fused into the backward pass
(`program.options.optimizer_fusion: backward`), per zoo model and optimizer, as the
ratio fused / standard measured in the same run (rounds alternate, the median is kept).

    python scripts/bench_backward_fusion.py
    python scripts/bench_backward_fusion.py --models resnet18 --optimizers adam --steps 20
    python scripts/bench_backward_fusion.py --device cuda --precision bf16 --batch 128
    python scripts/bench_backward_fusion.py --buckets 1,4,16   # 1: an optimizer call per parameter
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
from hypersack.runner import backward, zoo
from hypersack.runner.torch_train import Stepper


def _batch(model: str, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    vocab = zoo.VOCAB.get(model, 0)
    if vocab:
        return (torch.randint(0, vocab, (batch, 128), generator=g),
                torch.randint(0, 2, (batch,), generator=g))
    return (torch.randn(batch, 3, 32, 32, generator=g),
            torch.randint(0, 10, (batch,), generator=g))


def step_time(model_name: str, optimizer: str, fusion: str, batch: int, steps: int,
              device: torch.device, dtype: torch.dtype | None = None) -> float:
    """Median seconds per training step (forward, backward, update; on a GPU, until the
    device has finished it)."""
    torch.manual_seed(0)
    model = zoo.build(model_name).to(device).train()
    params: dict[str, Any] = {"optimizer": optimizer, "lr": 1e-3}
    stepper = Stepper(model, params, TrainOptions(optimizer_fusion=fusion),  # type: ignore[arg-type]
                      torch.amp.GradScaler(device.type, enabled=False))
    x, y = (t.to(device) for t in _batch(model_name, batch))
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=dtype or torch.bfloat16,
                            enabled=dtype is not None):
            out = model(x)
        stepper.step(nn.functional.cross_entropy(out.float(), y))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
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
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the first GPU)")
    ap.add_argument("--buckets", default=str(backward.BUCKET_PARAMS),
                    help="comma-separated parameters per bucket of the backward-fused loop, "
                         "each timed (1: one optimizer call per parameter)")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="the forward pass under autocast in bf16, as the trainer runs it "
                         "(fp16 is refused with backward fusion)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.precision == "bf16" else None
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"torch {torch.__version__} on {where}, {args.precision}, {args.threads} thread(s), "
          f"batch {args.batch}, median of {args.steps} steps, best round of {args.rounds}")
    sizes = [int(b) for b in args.buckets.split(",")]
    print(f"{'model':<14}{'optimizer':<10}{'standard ms':>12}"
          + "".join(f"{f'bucket {n} ms':>14}{'ratio':>7}" for n in sizes))
    for model in args.models.split(","):
        for opt in args.optimizers.split(","):
            std: list[float] = []
            bwd: dict[int, list[float]] = {n: [] for n in sizes}
            for _ in range(args.rounds):  # alternating: drift hits each the same
                std.append(step_time(model, opt, "none", args.batch, args.steps, device,
                                     dtype))
                for n in sizes:
                    backward.BUCKET_PARAMS = n
                    bwd[n].append(step_time(model, opt, "backward", args.batch, args.steps,
                                            device, dtype))
            s = min(std)
            print(f"{model:<14}{opt:<10}{1000 * s:>12.1f}"
                  + "".join(f"{1000 * min(bwd[n]):>14.1f}{min(bwd[n]) / s:>7.3f}"
                            for n in sizes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
