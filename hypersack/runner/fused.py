"""Horizontally fused training: K trials of one model trained in one process.

The K members' parameters and buffers are stacked (`torch.func.stack_module_state`) and
one forward-backward pass runs all of them (`vmap` over `functional_call`), fed by one
data pipeline. Each member keeps its own hyperparameters (learning rate, weight decay,
momentum, Adam's betas and epsilon, initialization seed), its own unreduced loss and
metrics, and its own gradient clipping; the update (SGD with momentum, Adam or AdamW, as
`torch.optim` computes them) is applied to all members at once with `foreach`
operations over the stacked tensors, each member's factors broadcast along its slice
(optimizer fusion). The optimizer is one per group (it is part of the workload key).

Members are isolated: one whose loss or gradients turn NaN or infinite is masked (its
updates stop, its parameters keep their last finite values) while the others go on,
and `diverged` says which. BatchNorm keeps running statistics per member.

Precision: fp32, or bf16/fp16 under autocast as the plain trainer runs them, fp16 with a
loss scale per member (amp.py): a member whose scaled gradients overflow skips only its
own step and lowers only its own scale; its loss turning non-finite is its divergence.

Not bit-identical to K separate runs: reductions inside a vmapped convolution or matmul
may sum in another order (float rounding; in float64 fused and separate runs agree to
1e-9, in float32 BatchNorm over small batches magnifies the rounding to about 1e-4 of a
parameter after a few steps), and
dropout draws one mask over the fused tensor (each member's part is independent, but the
random stream is not the one a separate run would use).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad_and_value, stack_module_state, vmap

from hypersack.core import optim
from hypersack.runner import amp
from hypersack.runner.attention import batched_attention

Loss = Callable[[Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Member:
    """One trial of a fused group: the hyperparameters fusion lets differ."""

    trial_id: str
    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    seed: int = 0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    clip_norm: float | None = None  # per member, never global


class FusedGroup:
    def __init__(self, build: Callable[[], nn.Module], members: Sequence[Member],
                 loss: Loss = nn.functional.cross_entropy,
                 device: torch.device | None = None, optimizer: str = "sgd",
                 clip_value: float | None = None, precision: str = "fp32",
                 compile: str | None = None) -> None:
        if not members:
            raise ValueError("a fused group needs at least one member")
        if optimizer not in optim.OPTIMIZERS:
            raise ValueError(f"no fused optimizer {optimizer!r}")
        self.optimizer = optimizer
        self.clip_value = clip_value  # every member's gradient elements clamped to it
        self.precision = precision
        self.dtype = amp.dtype_of(precision)  # autocast's (None: float32 throughout)
        self.members = list(members)
        models = []
        for m in self.members:
            torch.manual_seed(m.seed)
            models.append(build().to(device or "cpu").train())
        self.params, self.buffers = stack_module_state(models)
        for p in self.params.values():
            p.requires_grad_(False)  # torch.func computes the gradients
        self.base = copy.deepcopy(models[0]).to("meta")
        self.loss = loss
        k = len(self.members)
        on = device or torch.device("cpu")
        self.alive = torch.ones(k, dtype=torch.bool, device=on)
        self._alive_list: list[bool] | None = [True] * k  # the host's copy (None: stale)
        self.device_type = on.type
        self.scales = amp.LossScales(k, precision == "fp16", on)
        # Each member's optimizer steps taken (Adam's bias correction): a member that
        # skipped a step (fp16 overflow) counts one fewer.
        self._t = torch.zeros(k, dtype=torch.float64, device=on)
        self.stopped: set[str] = set()  # stopped or cancelled, not diverged
        self._lr = torch.tensor([m.lr for m in self.members], device=on)
        self._momentum = torch.tensor([m.momentum for m in self.members], device=on)
        self._decay = torch.tensor([m.weight_decay for m in self.members], device=on)
        self._clip = torch.tensor([m.clip_norm if m.clip_norm else math.inf
                                   for m in self.members], device=on)
        self._clipping = any(m.clip_norm for m in self.members)
        self._decaying = any(m.weight_decay for m in self.members)
        self._beta1 = torch.tensor([m.beta1 for m in self.members], device=on)
        self._beta2 = torch.tensor([m.beta2 for m in self.members], device=on)
        self._eps = torch.tensor([m.eps for m in self.members], device=on)
        # SGD's velocity, or Adam's first moment; Adam's second moment.
        self._velocity = [torch.zeros_like(p) for p in self.params.values()]
        self._second = ([torch.zeros_like(p) for p in self.params.values()]
                        if optimizer != "sgd" else [])
        # The forward-backward pass, or the same compiled by torch.compile in `compile`'s
        # mode ("default", "reduce-overhead", ...): on a GPU, vmap's batching costs the
        # host more than the device's work for small models (docs/gpu.md); a compiled
        # pass is traced once per batch shape and then runs as generated kernels.
        self._pass: Callable[..., Any] = self._forward_backward
        if compile is not None:
            self._pass = torch.compile(self._forward_backward, mode=compile, dynamic=False)

    @property
    def width(self) -> int:
        return len(self.members)

    def _alive(self) -> list[bool]:
        """Which members are live, read from the device only when the last step could
        not tell (a trial process asks after every step)."""
        if self._alive_list is None:
            self._alive_list = [bool(a) for a in self.alive.tolist()]
        return self._alive_list

    @property
    def diverged(self) -> list[str]:
        return [m.trial_id for m, ok in zip(self.members, self._alive(), strict=True)
                if not ok and m.trial_id not in self.stopped]

    @property
    def running(self) -> list[str]:
        return [m.trial_id for m, ok in zip(self.members, self._alive(), strict=True) if ok]

    def stop(self, trial_id: str) -> None:
        """Stop one member (early stopping, a cancelled trial): its updates end here and
        the others go on."""
        index = next(i for i, m in enumerate(self.members) if m.trial_id == trial_id)
        self.alive[index] = False
        self._alive_list = None
        self.stopped.add(trial_id)

    def evaluate(self, x: Tensor, y: Tensor) -> list[dict[str, float]]:
        """Each member's loss and accuracy on a batch, in evaluation mode (BatchNorm on
        its own running statistics, no dropout)."""
        self.base.eval()
        try:
            out = self.forward(x)
        finally:
            self.base.train()
        metrics = []
        for k in range(self.width):
            logits = out[k]
            metrics.append({"loss": float(self.loss(logits, y)),
                            "accuracy": float((logits.argmax(dim=-1) == y).double().mean())})
        return metrics

    def _autocast(self) -> Any:
        """As the plain trainer's: the model's forward in the trial's precision."""
        return torch.autocast(self.device_type, dtype=self.dtype,
                              enabled=self.dtype is not None)

    def _ops(self) -> Any:
        """What the vmapped pass needs: batched attention, and in mixed precision the
        normalisation layers in float32 (amp.py)."""
        stack = ExitStack()
        stack.enter_context(batched_attention())
        if self.dtype is not None:
            stack.enter_context(amp.norms_in_float32())
        return stack

    def _member_loss(self, params: dict[str, Tensor], buffers: dict[str, Tensor],
                     scale: Tensor, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """The member's loss times its loss scale (differentiated), and the loss."""
        with self._autocast():
            out = functional_call(self.base, (params, buffers), (x,))
        loss: Tensor = self.loss(out.float() if self.dtype is not None else out, y)
        return loss * scale if self.scales.enabled else loss, loss

    def forward(self, x: Tensor) -> Tensor:
        """Every member's output for one batch (K, batch, ...), without training."""
        def one(p: dict[str, Tensor], b: dict[str, Tensor]) -> Tensor:
            with self._autocast():
                out: Tensor = functional_call(self.base, (p, b), (x,))
            return out.float() if self.dtype is not None else out

        with torch.no_grad(), self._ops():
            out: Tensor = vmap(one, randomness="different")(self.params, self.buffers)
        return out

    def _forward_backward(self, params: dict[str, Tensor], buffers: dict[str, Tensor],
                          scale: Tensor, x: Tensor, y: Tensor) -> Any:
        """Every member's gradients and (scaled loss, loss), stacked along K."""
        with self._ops():
            return vmap(grad_and_value(self._member_loss, has_aux=True),
                        in_dims=(0, 0, 0, None, None), randomness="different")(
                params, buffers, scale, x, y)

    def step(self, x: Tensor, y: Tensor) -> Tensor:
        """One training step of every live member on the batch (x, y); each member's
        loss (K,), NaN for one that diverged now or before."""
        # A stopped or diverged member still rides along in the vmapped pass: its buffers
        # (BatchNorm's running statistics, small) are put back afterwards, like its
        # parameters, also for one that diverges in this very step.
        before = {n: t.clone() for n, t in self.buffers.items()}
        grads, (_, losses) = self._pass(self.params, self.buffers, self.scales.scale, x, y)
        names = list(self.params)
        g = [grads[n] for n in names]
        k = self.width
        # Each member's slice of a stacked tensor: its factors broadcast along it.
        shape = [(k,) + (1,) * (t.dim() - 1) for t in g]
        if self.scales.enabled:  # the true gradients, as GradScaler.unscale_ gives them
            inv = (1.0 / self.scales.scale).to(g[0].dtype)
            torch._foreach_mul_(g, [inv.view(s) for s in shape])
        # Each member's gradient norm over all its parameters: clipping and the NaN check
        # are per member.
        # In the gradients' own precision, as torch.nn.utils.clip_grad_norm_ takes it
        # (a float64 copy of every gradient cost a fifth of a BERT-Tiny step).
        norm = torch.linalg.vector_norm(torch.stack([
            torch.linalg.vector_norm(t.reshape(k, -1), dim=1) for t in g]), dim=0).double()
        finite_loss = torch.isfinite(losses.detach())
        finite_grads = torch.isfinite(norm)
        if self.scales.enabled:
            # fp16: gradients that overflow with a finite loss are the loss scale's, not
            # the member's: it skips this step and lowers its scale (amp.py). A loss
            # that is not finite is the member's own divergence.
            overflowed = finite_loss & ~finite_grads
            self.alive &= finite_loss
        else:
            overflowed = torch.zeros_like(finite_loss)
            self.alive &= finite_loss & finite_grads
        stepping = self.alive & ~overflowed
        # The step's one wait for the device: does every member step? (A boolean mask
        # as an index waits too, once per tensor: on a GPU each wait stops the host
        # from queueing work ahead, so masks below are applied with torch.where.)
        every = bool(stepping.all())
        self._alive_list = [True] * k if every else None
        if not every:
            with torch.no_grad():
                for n, saved in before.items():
                    buf = self.buffers[n]
                    keep = self.alive.view((k,) + (1,) * (buf.dim() - 1))
                    buf.copy_(torch.where(keep, buf, saved))
        self.scales.update(overflowed, self.alive)
        self._t += stepping.to(self._t.dtype)
        live = stepping.to(g[0].dtype)
        # As torch.nn.utils.clip_grad_norm_ computes it (1e-6 against a zero norm).
        scale = torch.clamp(self._clip / (norm + 1e-6), max=1.0).to(g[0].dtype)
        scale = torch.where(stepping, scale, torch.zeros_like(scale))
        # Every member steps with finite gradients (a finite norm says so), no norm to
        # clip: nothing to mask or scale, and a pass over every gradient saved.
        plain = every and not self._clipping
        with torch.no_grad():
            p = [self.params[n] for n in names]
            if not plain:
                g = [torch.nan_to_num(t, nan=0.0, posinf=0.0, neginf=0.0) for t in g]
                torch._foreach_mul_(g, [scale.view(s) for s in shape])
            if self.clip_value is not None:  # one mode at a time: the scale is 1 then
                for t in g:
                    t.clamp_(-self.clip_value, self.clip_value)
            if self.optimizer == "sgd":
                self._sgd(p, g, shape, live, every)
            else:
                self._adam(p, g, shape, live, every)
        out: Tensor = losses.detach()
        return torch.where(self.alive, out, torch.full_like(out, math.nan))

    def _sgd(self, p: list[Tensor], g: list[Tensor], shape: list[tuple[int, ...]],
             live: Tensor, every: bool) -> None:
        # SGD with momentum and weight decay, as torch.optim.SGD does it, with each
        # member's factors broadcast along its slice: d = g + wd p; v = m v + d;
        # p -= lr v. A member that does not step has lr 0, a zero gradient and its
        # velocity kept (torch.amp skips the whole step).
        if self._decaying or not every:  # else it adds zeros
            torch._foreach_add_(g, torch._foreach_mul(p, [(self._decay * live).view(s)
                                                          for s in shape]))
        keep = self._momentum * live + (1 - live)
        torch._foreach_mul_(self._velocity, [keep.view(s) for s in shape])
        torch._foreach_add_(self._velocity, g)
        torch._foreach_sub_(p, torch._foreach_mul(self._velocity,
                                                  [(self._lr * live).view(s) for s in shape]))

    def _adam(self, p: list[Tensor], g: list[Tensor], shape: list[tuple[int, ...]],
              live: Tensor, every: bool) -> None:
        # Adam and AdamW as torch.optim computes them (not amsgrad), per member:
        #   adam:  g += wd p          adamw: p *= 1 - lr wd
        #   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
        #   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
        # A masked member's moments stay as they were and its step is 0.
        t = self._t.to(self._beta1.dtype)
        decay = self._decay * live
        if not self._decaying and every:
            pass  # no decay: it would add zeros, or multiply by ones
        elif self.optimizer == "adam":
            torch._foreach_add_(g, torch._foreach_mul(p, [decay.view(s) for s in shape]))
        else:
            torch._foreach_mul_(p, [(1 - self._lr * decay).view(s) for s in shape])
        b1 = torch.where(live > 0, self._beta1, torch.ones_like(self._beta1))
        b2 = torch.where(live > 0, self._beta2, torch.ones_like(self._beta2))
        torch._foreach_mul_(self._velocity, [b1.view(s) for s in shape])
        torch._foreach_add_(self._velocity, torch._foreach_mul(g, [(1 - b1).view(s)
                                                                   for s in shape]))
        torch._foreach_mul_(self._second, [b2.view(s) for s in shape])
        torch._foreach_add_(self._second, torch._foreach_mul(
            torch._foreach_mul(g, g), [(1 - b2).view(s) for s in shape]))
        # A member yet to step (t = 0) divides by 1, not 0: its step is 0 anyway.
        bias1 = torch.where(t > 0, 1 - self._beta1 ** t, torch.ones_like(t))
        bias2 = torch.where(t > 0, 1 - self._beta2 ** t, torch.ones_like(t))
        step = self._lr * live / bias1
        root = bias2.sqrt()
        denom = torch._foreach_sqrt(self._second)
        torch._foreach_div_(denom, [root.view(s) for s in shape])
        torch._foreach_add_(denom, [self._eps.view(s) for s in shape])
        torch._foreach_sub_(p, torch._foreach_mul(torch._foreach_div(self._velocity, denom),
                                                  [step.view(s) for s in shape]))

    def member_state(self, index: int) -> dict[str, Tensor]:
        """One member's parameters and buffers, as a separate model's state_dict."""
        return {**{n: t[index].clone() for n, t in self.params.items()},
                **{n: t[index].clone() for n, t in self.buffers.items()}}

    # ------------------------------------------------------------- checkpoints
    def member_checkpoint(self, index: int) -> tuple[dict[str, Tensor],
                                                     dict[int, dict[str, Tensor]]]:
        """One member's model state_dict and its optimizer's per-parameter state, in
        torch.optim's layout (parameter i of `named_parameters`): SGD's
        `momentum_buffer`, Adam's `step`, `exp_avg`, `exp_avg_sq`. A trial paused in a
        group resumes alone (the plain trainer loads it) or in another group."""
        state: dict[int, dict[str, Tensor]] = {}
        for i in range(len(self.params)):
            if self.optimizer == "sgd":
                state[i] = {"momentum_buffer": self._velocity[i][index].clone()}
            else:
                state[i] = {"step": torch.tensor(float(self._t[index])),
                            "exp_avg": self._velocity[i][index].clone(),
                            "exp_avg_sq": self._second[i][index].clone()}
        return self.member_state(index), state

    def load_member(self, index: int, model: dict[str, Tensor],
                    state: dict[int, dict[str, Tensor]]) -> None:
        """Put a checkpoint (as `member_checkpoint` gives, or the plain trainer saves)
        into member `index`. Raises ValueError when it is another model's. Adam's step
        count is the member's own."""
        names = list(self.params)
        expected = set(names) | set(self.buffers)
        if set(model) != expected:
            raise ValueError("the checkpoint holds another model's parameters")
        with torch.no_grad():
            for n, t in model.items():
                target = self.params[n] if n in self.params else self.buffers[n]
                if target[index].shape != t.shape:
                    raise ValueError(f"the checkpoint's {n} has shape {tuple(t.shape)}")
                target[index].copy_(t.to(target.device, target.dtype))
            for i in range(len(names)):
                s = state.get(i, {})
                first = s.get("momentum_buffer" if self.optimizer == "sgd" else "exp_avg")
                self._velocity[i][index].copy_(first if first is not None else
                                               torch.zeros_like(self._velocity[i][index]))
                if self.optimizer != "sgd":
                    second = s.get("exp_avg_sq")
                    self._second[i][index].copy_(second if second is not None else
                                                 torch.zeros_like(self._second[i][index]))
                    if "step" in s:
                        self._t[index] = float(s["step"])
