"""The iteration schedule and per-epoch bookkeeping both built-in trainers share (the
NumPy one and the PyTorch one): shuffled batches, the split of each iteration into data
loading and compute, the SDK's profile hook, the report after each epoch, and the
checkpoint a trial paused by its pruner resumes from."""

from __future__ import annotations

import math

import numpy as np

from hypersack.runner import sdk


class Epochs:
    def __init__(self, samples: int, batch: int, epochs: float, rng: np.random.Generator
                 ) -> None:
        self.samples, self.batch, self.rng = samples, batch, rng
        self.iters_per_epoch = math.ceil(samples / batch)
        self.profiling = sdk.profiling()
        # A profile run ends when the SDK has timed enough iterations, or with the trial:
        # it is never longer than the trial itself.
        self.total = max(1, round(epochs * self.iters_per_epoch))
        self._order = np.arange(samples)
        self.start = 0  # the first iteration to run (after a checkpoint's epochs)
        self.steps = 0
        self._data_s = self._compute_s = 0.0

    def indices(self, i: int) -> np.ndarray:
        """The sample indices of iteration i; each epoch starts with a fresh shuffle."""
        pos = (i % self.iters_per_epoch) * self.batch
        if pos == 0:
            self._order = self.rng.permutation(self.samples)
        return self._order[pos:pos + self.batch]

    def done(self, i: int, data_s: float, compute_s: float) -> int | None:
        """Count iteration i (its seconds loading data and computing); the epoch number
        when it ended an epoch and the trainer should evaluate and report, else None.
        In a profile run there are no epoch ends: the SDK ends the process."""
        self.steps += 1
        self._data_s += data_s
        self._compute_s += compute_s
        sdk.iteration(data_s=data_s, iters_per_epoch=self.iters_per_epoch)
        if self.profiling or ((i + 1) % self.iters_per_epoch and i + 1 != self.total):
            return None
        return math.ceil((i + 1) / self.iters_per_epoch)

    def report(self, epoch: int, loss: float, accuracy: float, train_loss: float) -> bool:
        """Report the epoch through the SDK and the log; False when training diverged."""
        spent = self._data_s + self._compute_s
        share = self._data_s / spent if spent > 0 else 0.0
        sdk.report(step=epoch, loss=sdk.finite(loss), accuracy=accuracy,
                   train_loss=sdk.finite(train_loss), epoch=epoch,
                   iter_time_s=spent / self.steps, data_fraction=share)
        print(f"epoch {epoch}: loss {loss:.4f} accuracy {accuracy:.4f} train_loss "
              f"{train_loss:.4f} ({spent / self.steps * 1000:.1f} ms/iteration, "
              f"{100 * share:.0f} % loading data)", flush=True)
        self.steps, self._data_s, self._compute_s = 0, 0.0, 0.0
        if math.isfinite(loss) and math.isfinite(train_loss):
            return True
        print("diverged; stopping", flush=True)
        return False

    def resume(self, epoch: int) -> None:
        """Start after `epoch` epochs (a checkpoint's)."""
        self.start = min(self.total, epoch * self.iters_per_epoch)

    def pause(self, epoch: int) -> bool:
        """Whether to save a checkpoint and end now: the pruner ranks the trial at this
        epoch (never at the last one, nor in a profile run)."""
        return (not self.profiling and epoch * self.iters_per_epoch < self.total
                and sdk.should_stop(epoch))
