"""A fused trial process: K trials of one zoo model trained together by `FusedGroup`,
fed by one data pipeline, each reporting as its own trial.

    HYPERSACK_FUSED='{"model": "resnet18", "batch_size": 64, "epochs": 2,
                      "options": {"dataset": "synthetic"},
                      "members": [{"trial_id": "s-1-t00000", "lr": 0.1, "momentum": 0.9,
                                   "seed": 0, "metrics_file": ".../metrics.jsonl"}, ...]}'
    python -m hypersack.runner.fused_train

Each member's metrics go to its own file, in the lines `hypersack.report` writes (so
an agent reads them as it reads a plain trial's). A member whose loss turns NaN or
infinite reports `loss: NaN` once (a diverged trial to the scheduler) and stops; a
member whose `stop_file` appears stops after the current step (early stopping or a
cancel); the others go on. The process ends when every member ended.

This is the process a fused group runs in; the scheduler does not form fused groups
yet (fusion-aware planning is the next step).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hypersack.core.train_options import TrainOptions, parse_train_options
from hypersack.runner import datasets, zoo
from hypersack.runner.fused import FusedGroup, Member
from hypersack.runner.torch_train import Batches

ENV_FUSED = "HYPERSACK_FUSED"
MAX_MEMBERS = 64


@dataclass(frozen=True)
class FusedSpec:
    model: str
    batch_size: int
    epochs: int
    options: TrainOptions
    members: list[Member]
    metrics_files: list[Path]
    stop_files: list[Path | None]


def parse_spec(raw: str) -> FusedSpec:
    data = json.loads(raw)
    members = data.get("members")
    if not isinstance(members, list) or not 1 <= len(members) <= MAX_MEMBERS:
        raise ValueError(f"members: 1 to {MAX_MEMBERS} expected")
    model = str(data["model"])
    if model not in zoo.BUILDERS:
        raise ValueError(f"no zoo model {model!r}")
    return FusedSpec(
        model=model, batch_size=int(data.get("batch_size", 64)),
        epochs=max(1, math.ceil(float(data.get("epochs", 1)))),
        options=parse_train_options(data.get("options", {}), "options"),
        members=[Member(str(m["trial_id"]), lr=float(m.get("lr", 0.01)),
                        momentum=float(m.get("momentum", 0.9)),
                        weight_decay=float(m.get("weight_decay", 0.0)),
                        seed=int(m.get("seed", 0)),
                        clip_norm=float(m["clip_norm"]) if m.get("clip_norm") else None)
                 for m in members],
        metrics_files=[Path(m["metrics_file"]) for m in members],
        stop_files=[Path(m["stop_file"]) if m.get("stop_file") else None for m in members])


def _report(path: Path, step: int, **metrics: float) -> None:
    line = json.dumps({"t": time.time(), "step": step, "metrics": metrics})
    with open(path, "a") as f:
        f.write(line + "\n")


def train(spec: FusedSpec) -> dict[str, str]:
    """Train every member to the end; each member's outcome: completed, diverged or
    stopped."""
    opts = spec.options
    data = datasets.load(spec.model, opts, zoo.VOCAB.get(spec.model, 0))
    device = torch.device("cpu")

    def build() -> torch.nn.Module:
        model = zoo.build(spec.model)
        if data.kind == "text" or spec.model in ("vit_tiny", "deit_tiny"):
            zoo.init_scale(model)
        return model

    group = FusedGroup(build, spec.members)
    train_b = Batches(data, data.train, device, opts.augment, opts.seed)
    val_b = Batches(data, data.val, device, False, opts.seed)
    rng = np.random.default_rng(opts.seed)
    batches = math.ceil(data.train.size / spec.batch_size)
    reported: set[str] = set()
    for epoch in range(1, spec.epochs + 1):
        order = rng.permutation(data.train.size)
        for i in range(batches):
            for m, stop in zip(spec.members, spec.stop_files, strict=True):
                if stop is not None and stop.exists() and m.trial_id in group.running:
                    group.stop(m.trial_id)
            if not group.running:
                break
            x, y = train_b.get(order[i * spec.batch_size:(i + 1) * spec.batch_size])
            group.step(x, y)
            for k, m in enumerate(spec.members):
                if m.trial_id in group.diverged and m.trial_id not in reported:
                    _report(spec.metrics_files[k], epoch, loss=math.nan)
                    reported.add(m.trial_id)
        if not group.running:
            break
        # Validation: every member on the same batches, each on its own statistics.
        sums = [[0.0, 0.0] for _ in spec.members]
        seen = 0
        for pos in range(0, data.val.size, spec.batch_size):
            x, y = val_b.get(np.arange(pos, min(pos + spec.batch_size, data.val.size)))
            for k, metrics in enumerate(group.evaluate(x, y)):
                sums[k][0] += metrics["loss"] * len(y)
                sums[k][1] += metrics["accuracy"] * len(y)
            seen += len(y)
        for k, m in enumerate(spec.members):
            if m.trial_id in group.running:
                _report(spec.metrics_files[k], epoch, loss=sums[k][0] / seen,
                        accuracy=sums[k][1] / seen, epoch=epoch)
    return {m.trial_id: ("diverged" if m.trial_id in group.diverged else
                         "stopped" if m.trial_id in group.stopped else "completed")
            for m in spec.members}


def main() -> None:
    spec = parse_spec(os.environ[ENV_FUSED])
    outcome = train(spec)
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
