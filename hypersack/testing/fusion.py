"""Helpers for tests that compare fused groups with separate runs (imports torch)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from hypersack.runner import amp
from hypersack.runner.fused import Member


def without_dropout(build: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    """`build`, with every dropout off: a fused group draws one mask over its stacked
    tensors, another random stream than separate runs', so only dropout-free runs compare."""
    def make() -> nn.Module:
        model = build()
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
            if isinstance(m, nn.MultiheadAttention):
                m.dropout = 0.0
        return model
    return make


def separate_amp_run(make: Callable[[], nn.Module], m: Member,
                     batches: list[tuple[Tensor, Tensor]], optimizer: str, precision: str,
                     init_scale: float = amp.INIT_SCALE,
                     scale_at: dict[int, float] | None = None, device: str = "cpu"
                     ) -> tuple[list[float], dict[str, Tensor], torch.amp.GradScaler]:
    """One member trained as the plain trainer trains a trial, for `batches` on `device`:
    autocast in `precision`, a GradScaler for fp16 (its scale set to `scale_at[i]` before
    step i). Its losses, final state and scaler."""
    torch.manual_seed(m.seed)
    model = make().to(device).train()
    opt: torch.optim.Optimizer
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=m.lr, momentum=m.momentum,
                              weight_decay=m.weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=m.lr, weight_decay=m.weight_decay)
    kind = torch.device(device).type
    scaler = torch.amp.GradScaler(kind, enabled=precision == "fp16", init_scale=init_scale)
    losses = []
    for i, (x, y) in enumerate(batches):
        if scale_at and i in scale_at:
            scaler.update(new_scale=scale_at[i])
        opt.zero_grad(set_to_none=True)
        with torch.autocast(kind, dtype=amp.dtype_of(precision) or torch.bfloat16,
                            enabled=precision != "fp32"):
            loss: Tensor = nn.functional.cross_entropy(model(x.to(device)).float(),
                                                       y.to(device))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.detach()))
    return losses, model.state_dict(), scaler


def weight_gap(a: dict[str, Tensor], b: dict[str, Tensor]) -> float:
    """The largest difference of any weight of two state dicts (running statistics
    aside)."""
    return max(float((a[n].cpu() - b[n].cpu()).abs().max()) for n in b
               if b[n].is_floating_point() and "running" not in n)
