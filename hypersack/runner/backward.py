"""Optimizer steps fused into the backward pass (`program.options.optimizer_fusion:
backward`): parameters are updated from post-accumulate-grad hooks while the backward
pass goes on, and their gradients freed at once, instead of one optimizer step over
every parameter after the whole pass. The parameters are cut into buckets of
consecutive ones, last first (the order in which backward makes their gradients final);
a bucket is updated by its own optimizer as soon as every one of its gradients is
final, so that one call updates several parameters (one `torch.optim` call per
parameter cost more host time than the update itself on a GPU: 1.6-2.5x the standard
loop's step on an H200, docs/gpu.md). The update of each parameter is the one
`torch.optim` computes (SGD, Adam and AdamW act on each parameter alone), so the
trained weights equal the standard loop's; what changes is when each update runs and
that no gradient outlives its bucket's update.

Clipping: `clip_grad_value` clamps each gradient element before its update (per
parameter, so it fuses); a global norm (`clip_grad_norm`) needs every gradient before
any update and is refused with this mode (core.train_options). Mixed precision with a
loss scale (fp16) is refused too: the scaler decides to skip a step from every
gradient's overflow, after the backward pass; bf16 needs no scaler and fuses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

MakeOptimizer = Callable[[list[nn.Parameter]], torch.optim.Optimizer]

# Parameters per bucket: ResNet-18's 62 take 4 optimizer calls a step instead of 62.
BUCKET_PARAMS = 16


class BackwardFused:
    """Hooks on `parameters` that step each bucket's optimizer during backward; the
    loop calls backward, then `finish()` (a bucket some of whose parameters got no
    gradient this step is updated there). Its state is saved and loaded in one
    `torch.optim` optimizer's form (see `state_dict`)."""

    def __init__(self, parameters: Iterable[nn.Parameter], make: MakeOptimizer,
                 clip_value: float | None = None, bucket_params: int | None = None) -> None:
        self.params = [p for p in parameters if p.requires_grad]
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError("a parameter is listed twice")
        if bucket_params is None:
            bucket_params = BUCKET_PARAMS
        if bucket_params < 1:
            raise ValueError("a bucket holds at least one parameter")
        # Each bucket's parameters' indexes in self.params, last parameters first.
        order = list(range(len(self.params)))[::-1]
        self.buckets = [sorted(order[i:i + bucket_params])
                        for i in range(0, len(order), bucket_params)]
        self.optimizers = [make([self.params[i] for i in b]) for b in self.buckets]
        self.clip_value = clip_value
        self.updates = 0  # parameter updates made (a test sees every hook fire)
        self._ready = [0] * len(self.buckets)  # gradients final this step, per bucket
        for k, bucket in enumerate(self.buckets):
            for i in bucket:
                self.params[i].register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
                    self._hook(k))

    def _hook(self, bucket: int) -> Callable[[Tensor], None]:
        def ready(param: Tensor) -> None:
            if param.grad is None:
                return
            if self.clip_value is not None:
                param.grad.clamp_(-self.clip_value, self.clip_value)
            self._ready[bucket] += 1
            if self._ready[bucket] == len(self.buckets[bucket]):
                self._update(bucket)
        return ready

    def _update(self, bucket: int) -> None:
        opt = self.optimizers[bucket]
        stepped = sum(1 for i in self.buckets[bucket] if self.params[i].grad is not None)
        opt.step()  # a parameter without a gradient is skipped, as torch.optim skips it
        opt.zero_grad(set_to_none=True)  # their memory goes back at once
        self.updates += stepped
        self._ready[bucket] = 0

    def finish(self) -> None:
        """After backward: update the buckets that some parameters left incomplete
        (a parameter the loss did not reach gets no gradient and no hook call)."""
        for k, count in enumerate(self._ready):
            if count:
                self._update(k)

    def state_dict(self) -> dict[str, Any]:
        """In the form one `torch.optim` optimizer over every parameter gives: a
        checkpoint of either loop (and of a fused group) resumes in the other."""
        state: dict[Any, Any] = {}
        group: dict[str, Any] = {}
        for bucket, opt in zip(self.buckets, self.optimizers, strict=True):
            own = opt.state_dict()
            for local, i in enumerate(bucket):
                if local in own["state"]:
                    state[i] = own["state"][local]
            group = own["param_groups"][0]
        return {"state": state, "param_groups": [{**group,
                                                  "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        groups = state.get("param_groups")
        if not isinstance(groups, list) or len(groups) != 1 or \
                len(groups[0].get("params", ())) != len(self.params):
            raise ValueError("the checkpoint's optimizer state is for other parameters")
        per = state.get("state", {})
        for bucket, opt in zip(self.buckets, self.optimizers, strict=True):
            opt.load_state_dict({
                "state": {local: per[i] for local, i in enumerate(bucket) if i in per},
                "param_groups": [{**groups[0], "params": list(range(len(bucket)))}]})
