"""Optimizer steps fused into the backward pass (`program.options.optimizer_fusion:
backward`): each parameter is updated by its own optimizer from a post-accumulate-grad
hook as soon as its gradient is final, and its gradient freed at once, instead of one
optimizer step over every parameter after the whole backward pass. The update of each
parameter is the one `torch.optim` computes (SGD, Adam and AdamW act on each parameter
alone), so the trained weights equal the standard loop's; what changes is when each
update runs (while the backward pass goes on with earlier layers, on data still in
cache) and that no gradient outlives its update.

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


class BackwardFused:
    """Hooks on `parameters` that step each one's optimizer during backward; the loop
    only calls backward. Its state is saved and loaded in one `torch.optim` optimizer's
    form (see `state_dict`)."""

    def __init__(self, parameters: Iterable[nn.Parameter], make: MakeOptimizer,
                 clip_value: float | None = None) -> None:
        self.params = [p for p in parameters if p.requires_grad]
        if len({id(p) for p in self.params}) != len(self.params):
            raise ValueError("a parameter is listed twice")
        self.optimizers = [make([p]) for p in self.params]
        self.clip_value = clip_value
        self.updates = 0  # parameter updates made (a test sees every hook fire)
        for p, opt in zip(self.params, self.optimizers, strict=True):
            p.register_post_accumulate_grad_hook(self._hook(opt))  # type: ignore[no-untyped-call]

    def _hook(self, opt: torch.optim.Optimizer) -> Callable[[Tensor], None]:
        def update(param: Tensor) -> None:
            if param.grad is None:
                return
            if self.clip_value is not None:
                param.grad.clamp_(-self.clip_value, self.clip_value)
            opt.step()
            opt.zero_grad(set_to_none=True)  # its memory goes back at once
            self.updates += 1
        return update

    def state_dict(self) -> dict[str, Any]:
        """In the form one `torch.optim` optimizer over every parameter gives: a
        checkpoint of either loop (and of a fused group) resumes in the other."""
        state: dict[Any, Any] = {}
        group: dict[str, Any] = {}
        for i, opt in enumerate(self.optimizers):
            own = opt.state_dict()
            if 0 in own["state"]:
                state[i] = own["state"][0]
            group = own["param_groups"][0]
        return {"state": state, "param_groups": [{**group,
                                                  "params": list(range(len(self.params)))}]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        groups = state.get("param_groups")
        if not isinstance(groups, list) or len(groups) != 1 or \
                len(groups[0].get("params", ())) != len(self.params):
            raise ValueError("the checkpoint's optimizer state is for other parameters")
        per = state.get("state", {})
        for i, opt in enumerate(self.optimizers):
            opt.load_state_dict({"state": {0: per[i]} if i in per else {},
                                 "param_groups": [{**groups[0], "params": [0]}]})
