"""The PyTorch training loop of the built-in `train` program (zoo models).

One process trains one trial on the device it is given (`CUDA_VISIBLE_DEVICES`), or on
the CPU when no GPU is visible. Batches are cut from arrays held in memory; images are
augmented (random crop with 4 pixels of padding, horizontal flip) on the CPU and
normalised on the device. The time spent producing a batch and moving it to the
device is the iteration's data-loading time.

In a profile run (`hypersack.runner.sdk.profiling()`) it first times a few
validation batches (an epoch's evaluation cost), then the SDK times the training
iterations and ends the process; the device is synchronised after each iteration so
that the times are the device's, not the launch queue's.
"""

from __future__ import annotations

import functools
import math
import platform
import time
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hypersack import __version__
from hypersack.core import optim
from hypersack.core.errors import InvalidInput
from hypersack.core.train_options import TrainOptions, trial_seed
from hypersack.runner import amp, datasets, sdk, zoo
from hypersack.runner.backward import BackwardFused
from hypersack.runner.loop import Epochs
from hypersack.runner.sdk import checkpoint_path, save_checkpoint

EVAL_PROBE_BATCHES = 3
CHECKPOINT = ".pt"  # `checkpoint.pt` in the trial's checkpoint folder (the fused trainer's too)


def versions(device: torch.device) -> str:
    parts = [f"hypersack={__version__}", f"torch={torch.__version__}",
             f"python={platform.python_version()}"]
    if device.type == "cuda":
        parts += [f"cuda={torch.version.cuda}", f"cudnn={torch.backends.cudnn.version()}",
                  f"gpu={torch.cuda.get_device_name(device)}"]
    return " ".join(parts)


def optimizer_for(name: str, parameters: Iterable[nn.Parameter], params: dict[str, Any]
                  ) -> torch.optim.Optimizer:
    """`torch.optim`'s optimizer `name` over `parameters`, with the trial's hyperparameters."""
    h = optim.hyperparameters(name, params)
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=h["lr"], weight_decay=h["weight_decay"],
                               momentum=h["momentum"])
    kind = torch.optim.Adam if name == "adam" else torch.optim.AdamW
    return kind(parameters, lr=h["lr"], betas=(h["beta1"], h["beta2"]), eps=h["eps"],
                weight_decay=h["weight_decay"])


def make_optimizer(name: str, model: nn.Module, params: dict[str, Any]) -> torch.optim.Optimizer:
    return optimizer_for(name, model.parameters(), params)


class Stepper:
    """One training step's gradient handling as `opts` asks: the standard loop (zero,
    backward, clip, step; a loss scale for fp16) or the updates fused into backward
    (runner/backward.py). Both compute the same weights."""

    def __init__(self, model: nn.Module, params: dict[str, Any], opts: TrainOptions,
                 scaler: torch.amp.GradScaler) -> None:
        name = str(params.get("optimizer", "sgd"))
        optim.check(name)
        self.scaler = scaler
        self.opts = opts
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.fused: BackwardFused | None = None
        self.optimizer: Any
        if opts.optimizer_fusion == "backward":
            if scaler.is_enabled():
                raise InvalidInput(
                    "optimizer_fusion: backward does not take precision fp16: its loss "
                    "scale skips a step from every gradient's overflow, after the backward "
                    "pass; use bf16 or fp32, or optimizer_fusion: none")
            self.fused = BackwardFused(self.params, lambda ps: optimizer_for(name, ps, params),
                                       clip_value=opts.clip_grad_value)
            self.optimizer = self.fused
        else:
            self.optimizer = optimizer_for(name, self.params, params)

    def step(self, loss: Tensor) -> None:
        if self.fused is not None:
            loss.backward()  # every parameter is updated on the way
            self.fused.finish()  # or here, in a bucket that a parameter left open
            return
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        norm, value = self.opts.clip_grad_norm, self.opts.clip_grad_value
        if norm is not None or value is not None:
            self.scaler.unscale_(self.optimizer)  # clip the true gradients
            if norm is not None:
                nn.utils.clip_grad_norm_(self.params, norm)
            elif value is not None:
                nn.utils.clip_grad_value_(self.params, value)
        self.scaler.step(self.optimizer)
        self.scaler.update()


class Batches:
    """Cuts, augments and moves batches of one split."""

    def __init__(self, data: datasets.Data, split: datasets.Split, device: torch.device,
                 augment: bool, seed: int) -> None:
        self.data, self.split, self.device = data, split, device
        self.augment = augment and data.kind == "image"
        self.rng = np.random.default_rng(seed)
        if data.kind == "image":
            self.mean = torch.tensor(datasets.CIFAR_MEAN * 255, device=device)
            self.std = torch.tensor(datasets.CIFAR_STD * 255, device=device)

    def get(self, idx: np.ndarray) -> tuple[Tensor, Tensor]:
        x, y = self.split.batch(idx)
        if self.augment:
            x = self._crop_flip(x)
        xt = torch.from_numpy(np.ascontiguousarray(x)).to(self.device, non_blocking=True)
        yt = torch.from_numpy(y).to(self.device, non_blocking=True)
        if self.data.kind == "image":
            xt = (xt.float() - self.mean) / self.std
        return xt, yt

    def _crop_flip(self, x: np.ndarray) -> np.ndarray:
        n = len(x)
        padded = np.pad(x, ((0, 0), (0, 0), (4, 4), (4, 4)))
        dx, dy = self.rng.integers(0, 9, n), self.rng.integers(0, 9, n)
        out = np.empty_like(x)
        for i in range(n):
            out[i] = padded[i, :, dy[i]:dy[i] + 32, dx[i]:dx[i] + 32]
        flip = self.rng.random(n) < 0.5
        out[flip] = out[flip, :, :, ::-1]
        return out


def train(model_name: str, params: dict[str, Any], epochs: float, opts: TrainOptions) -> float:
    # The initialisation's seed (a seed hyperparameter's, as a fused member's).
    torch.manual_seed(trial_seed(opts.seed, params))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data = datasets.load(model_name, opts, zoo.VOCAB.get(model_name, 0))
    model = zoo.build(model_name)
    if data.kind == "text" or model_name in ("vit_tiny", "deit_tiny"):
        zoo.init_scale(model)
    model.to(device)
    precision = str(params.get("precision", "fp32"))
    if precision not in amp.DTYPES:  # the one table of precisions (the fused groups' too)
        raise InvalidInput(f"unknown precision {precision!r}; valid: {', '.join(amp.DTYPES)}")
    dtype = amp.DTYPES[precision]
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    stepper = Stepper(model, params, opts, scaler)
    optimizer = stepper.optimizer
    batch = int(params.get("batch_size", 64))
    train_b = Batches(data, data.train, device, opts.augment, opts.seed)
    val_b = Batches(data, data.val, device, False, opts.seed)
    ep = Epochs(data.train.size, batch, epochs, np.random.default_rng(opts.seed))
    profiling = ep.profiling
    saved = None if profiling else checkpoint_path(CHECKPOINT)
    if saved is not None and saved.exists():
        state = torch.load(saved, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        ep.resume(int(state["epoch"]))
        print(f"resumed from {saved} after epoch {ep.start // ep.iters_per_epoch}",
              flush=True)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=dtype, enabled=dtype is not None)

    def evaluate(limit: int | None = None) -> tuple[float, float]:
        model.eval()
        loss_sum, correct, seen = 0.0, 0, 0
        with torch.no_grad(), autocast():
            for j, pos in enumerate(range(0, data.val.size, batch)):
                if limit is not None and j >= limit:
                    break
                x, y = val_b.get(np.arange(pos, min(pos + batch, data.val.size)))
                out = model(x).float()
                loss_sum += float(F.cross_entropy(out, y, reduction="sum"))
                correct += int((out.argmax(dim=1) == y).sum())
                seen += len(y)
        model.train()
        return loss_sum / max(1, seen), correct / max(1, seen)

    try:
        if profiling:
            # An epoch's evaluation cost, from a few validation batches after one warm-up.
            evaluate(limit=1)
            sync()
            t0 = time.perf_counter()
            probe = min(EVAL_PROBE_BATCHES, math.ceil(data.val.size / batch))
            evaluate(limit=probe)
            sync()
            per_batch = (time.perf_counter() - t0) / probe
            sdk.set_profile_info(eval_s_per_epoch=per_batch * math.ceil(data.val.size / batch),
                                 versions=versions(device))
        model.train()
        loss = math.inf
        epoch_loss = torch.zeros((), device=device)  # summed on the device: no sync per step
        for i in range(ep.start, ep.total):
            t0 = time.perf_counter()
            x, y = train_b.get(ep.indices(i))
            if profiling:
                sync()
            t1 = time.perf_counter()
            with autocast():
                out = model(x)
                batch_loss = F.cross_entropy(out.float(), y)
            stepper.step(batch_loss)
            epoch_loss += batch_loss.detach()
            if profiling:
                sync()
            epoch = ep.done(i, t1 - t0, time.perf_counter() - t1)
            if epoch is not None:
                train_loss = float(epoch_loss) / ep.steps
                loss, acc = evaluate()
                epoch_loss.zero_()
                if not ep.report(epoch, loss, acc, train_loss):
                    break
                if ep.pause(epoch):
                    state = {"epoch": epoch, "model": model.state_dict(),
                             "optimizer": optimizer.state_dict(),
                             "scaler": scaler.state_dict()}
                    save_checkpoint(CHECKPOINT, functools.partial(torch.save, state))
                    break
    except torch.OutOfMemoryError:
        sdk.out_of_memory(f"out of memory: {model_name} at batch size {batch} on {device}")
    return loss
