"""A fused trial process: K trials of one zoo model trained together by `FusedGroup`,
fed by one data pipeline, each reporting as its own trial.

    HYPERSACK_FUSED='{"model": "resnet18", "batch_size": 64, "epochs": 2, "optimizer": "sgd",
                      "options": {"dataset": "synthetic"},
                      "members": [{"trial_id": "s-1-t00000", "lr": 0.1, "momentum": 0.9,
                                   "seed": 0, "metrics_file": ".../metrics.jsonl"}, ...]}'
    python -m hypersack.runner.fused_train

Each member's metrics go to its own file, in the lines `hypersack.report` writes (so
an agent reads them as it reads a plain trial's). A member whose loss turns NaN or
infinite reports `loss: NaN` once (a diverged trial to the scheduler) and stops; a
member whose `stop_file` appears stops after the current step (early stopping or a
cancel); the others go on. The process ends when every member ended.

Each member's file ends with `{"end": "completed" | "diverged" | "stopped"}` when the
member ends. In a profile run (`HYPERSACK_PROFILE_FILE` set) the SDK times the whole
group's iterations: the profile of the fused width.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hypersack.core import optim
from hypersack.core.bounds import MAX_FUSED_MEMBERS
from hypersack.core.train_options import TrainOptions, check_seed, parse_train_options
from hypersack.core.trial_env import ENV_FUSED
from hypersack.runner import amp, datasets, sdk, zoo
from hypersack.runner.fused import FusedGroup, Member
from hypersack.runner.loop import Epochs
from hypersack.runner.torch_train import CHECKPOINT, Batches, make_optimizer, versions


@dataclass(frozen=True)
class FusedSpec:
    model: str
    batch_size: int
    epochs: float
    options: TrainOptions
    optimizer: str
    members: list[Member]
    metrics_files: list[Path]
    stop_files: list[Path | None]
    # Early stopping: each member's checkpoint folder (None: none), and the epoch the
    # group stops at to be ranked (0: its last); every member is at the same rung.
    checkpoint_dirs: list[Path | None]
    stop_at: float = 0.0
    precision: str = "fp32"  # fp32, bf16, fp16 (autocast; fp16 with a scale per member)


def parse_spec(raw: str) -> FusedSpec:
    data = json.loads(raw)
    members = data.get("members")
    if not isinstance(members, list) or not 1 <= len(members) <= MAX_FUSED_MEMBERS:
        raise ValueError(f"members: 1 to {MAX_FUSED_MEMBERS} expected")
    model = str(data["model"])
    if model not in zoo.BUILDERS:
        raise ValueError(f"no zoo model {model!r}")
    optimizer = optim.check(str(data.get("optimizer", "sgd")))
    options = parse_train_options(data.get("options", {}), "options")

    def member(m: dict[str, Any]) -> Member:
        # The group's optimizer's hyperparameters, defaulted and checked.
        h = optim.hyperparameters(optimizer, m)
        clip = float(m["clip_norm"]) if m.get("clip_norm") else options.clip_grad_norm
        if clip is not None and not (math.isfinite(clip) and clip > 0):
            raise ValueError(f"clip_norm: {clip!r} is not a positive number")
        return Member(str(m["trial_id"]), seed=check_seed(m.get("seed", 0)), clip_norm=clip,
                      **h)

    return FusedSpec(
        model=model, batch_size=int(data.get("batch_size", 64)),
        epochs=min(max(float(data.get("epochs", 1)), 1e-6), 1e6),
        options=options, optimizer=optimizer,
        members=[member(m) for m in members],
        metrics_files=[Path(m["metrics_file"]) for m in members],
        stop_files=[Path(m["stop_file"]) if m.get("stop_file") else None for m in members],
        checkpoint_dirs=[Path(m["checkpoint_dir"]) if m.get("checkpoint_dir") else None
                         for m in members],
        stop_at=_epoch(data.get("stop_at", 0.0)),
        precision=_precision(data.get("precision", "fp32")))


def _precision(raw: Any) -> str:
    if raw not in amp.DTYPES:
        raise ValueError(f"precision: {raw!r}; valid: {', '.join(amp.DTYPES)}")
    return str(raw)


def _epoch(raw: Any) -> float:
    value = float(raw)
    return value if math.isfinite(value) and 0 < value <= 1e6 else 0.0


def _resume(group: FusedGroup, spec: FusedSpec, device: torch.device) -> int:
    """Load every member's checkpoint; the epoch the group resumes after. Only when all
    members have one of the same epoch (a group is one rung's trials, and a promoted
    trial's checkpoint is on the node it paused on): otherwise all start from scratch,
    which costs time and never correctness."""
    found: list[dict[str, Any] | None] = []
    for folder in spec.checkpoint_dirs:
        path = sdk.checkpoint_file(folder, CHECKPOINT) if folder is not None else None
        if path is None or not path.exists():
            found.append(None)
            continue
        found.append(torch.load(path, map_location=device, weights_only=True))
    if not any(found):
        return 0
    epochs = {int(s["epoch"]) for s in found if s is not None}
    if None in found or len(epochs) != 1:
        print("members' checkpoints differ (missing, or of other epochs): every member "
              "starts from scratch", flush=True)
        return 0
    for k, state in enumerate(found):
        assert state is not None
        group.load_member(k, state["model"], state["optimizer"]["state"])
        group.scales.load(k, state.get("scaler") or {})
    epoch = epochs.pop()
    print(f"resumed {len(found)} members from their checkpoints after epoch {epoch}",
          flush=True)
    return epoch


def _save(group: FusedGroup, spec: FusedSpec, k: int, epoch: int,
          build: Callable[[], torch.nn.Module]) -> None:
    """Member k's checkpoint, as the plain trainer writes it (a state_dict, torch.optim's
    state_dict, the epoch), written whole or not at all."""
    folder = spec.checkpoint_dirs[k]
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    model_state, opt_state = group.member_checkpoint(k)
    model = build().to("cpu")
    model.load_state_dict({n: t.cpu() for n, t in model_state.items()})
    m = spec.members[k]
    optimizer = make_optimizer(spec.optimizer, model, {
        "lr": m.lr, "momentum": m.momentum, "weight_decay": m.weight_decay,
        "beta1": m.beta1, "beta2": m.beta2, "eps": m.eps})
    for p, held in zip(model.parameters(), opt_state.values(), strict=True):
        optimizer.state[p] = {n: t.cpu() for n, t in held.items()}
    # The plain trainer's checkpoint file: either trainer resumes the other's.
    state: dict[str, Any] = {"epoch": epoch, "model": model.state_dict(),
                             "optimizer": optimizer.state_dict(),
                             "scaler": group.scales.state_dict(k)}
    sdk.write_whole(sdk.checkpoint_file(folder, CHECKPOINT),
                    functools.partial(torch.save, state))


def _report(path: Path, step: int, **metrics: float) -> None:
    _append(path, {"t": time.time(), "step": step, "metrics": metrics})


def _end(path: Path, outcome: str) -> None:
    """The member's last line: it ended (completed, diverged or stopped) while the group
    may go on; the agent reports it as its own trial's exit."""
    _append(path, {"t": time.time(), "end": outcome})


def _append(path: Path, record: dict[str, object]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def train(spec: FusedSpec) -> dict[str, str]:
    """Train every member to the end; each member's outcome: completed, diverged or
    stopped. In a profile run (`sdk.profiling()`) the SDK times the group's iterations
    and ends the process: a fused width's profile."""
    opts = spec.options
    data = datasets.load(spec.model, opts, zoo.VOCAB.get(spec.model, 0))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def build() -> torch.nn.Module:
        model = zoo.build(spec.model)
        if data.kind == "text" or spec.model in ("vit_tiny", "deit_tiny"):
            zoo.init_scale(model)
        return model

    try:
        group = FusedGroup(build, spec.members, device=device, optimizer=spec.optimizer,
                           clip_value=spec.options.clip_grad_value,
                           precision=spec.precision)
    except torch.OutOfMemoryError:
        sdk.out_of_memory(f"out of memory: {spec.model} fused x{len(spec.members)}")
    train_b = Batches(data, data.train, device, opts.augment, opts.seed)
    val_b = Batches(data, data.val, device, False, opts.seed)
    ep = Epochs(data.train.size, spec.batch_size, spec.epochs, np.random.default_rng(opts.seed))
    if ep.profiling:
        sdk.set_profile_info(versions=versions(device) + f" fused={len(spec.members)}")
    ended: set[str] = set()
    if not ep.profiling:
        ep.resume(_resume(group, spec, device))

    def end(k: int, outcome: str) -> None:
        if spec.members[k].trial_id not in ended:
            ended.add(spec.members[k].trial_id)
            _end(spec.metrics_files[k], outcome)

    try:
        for i in range(ep.start, ep.total):
            for k, (m, stop) in enumerate(zip(spec.members, spec.stop_files, strict=True)):
                if stop is not None and m.trial_id in group.running and stop.exists():
                    group.stop(m.trial_id)
                    end(k, "stopped")
            if not group.running:
                break
            t0 = time.perf_counter()
            x, y = train_b.get(ep.indices(i))
            if ep.profiling:
                sync()
            t1 = time.perf_counter()
            group.step(x, y)
            if ep.profiling:
                sync()
            for k, m in enumerate(spec.members):
                if m.trial_id in group.diverged and m.trial_id not in ended:
                    _report(spec.metrics_files[k], i + 1, loss=math.nan)
                    end(k, "diverged")
            epoch = ep.done(i, t1 - t0, time.perf_counter() - t1)
            if epoch is None:
                continue
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
            if spec.stop_at and epoch >= spec.stop_at - 1e-9 and i + 1 < ep.total:
                # The rung: each running member saves its checkpoint and ends, to be
                # ranked (a member that diverged or was stopped has ended already).
                for k, m in enumerate(spec.members):
                    if m.trial_id in group.running:
                        _save(group, spec, k, epoch, build)
                print(f"paused at epoch {epoch}: checkpoints saved", flush=True)
                break
    except torch.OutOfMemoryError:
        sdk.out_of_memory(f"out of memory: {spec.model} fused x{len(spec.members)} at batch "
                          f"size {spec.batch_size} on {device}")
    outcome = {m.trial_id: ("diverged" if m.trial_id in group.diverged else
                            "stopped" if m.trial_id in group.stopped else "completed")
               for m in spec.members}
    for k, m in enumerate(spec.members):
        end(k, outcome[m.trial_id])
    return outcome


def main() -> None:
    spec = parse_spec(os.environ[ENV_FUSED])
    outcome = train(spec)
    print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
