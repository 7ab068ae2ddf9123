"""Mixed precision for fused groups: autocast as in a separate `torch.amp` run, a loss
scale per member for fp16, and normalisation layers that `vmap` can batch under
autocast.

fp16: each member has its own scale and growth tracker, updated as
`torch.amp.GradScaler` updates its one (init 2^16, x0.5 after a step whose gradients
overflowed, x2 after 2,000 steps in a row without one). A member whose gradients
overflow skips only its own step (its weights and optimizer state stay as they were,
its step count too) and lowers only its own scale; the others step. bf16 needs no scale.

Normalisation: under autocast a layer norm or batch norm gets a half-precision input and
float32 weights; their kernels take that mixed pair, but their batching rules under
`vmap` do not ("expected scalar type BFloat16 but found Float"). `norms_in_float32()`
runs them on the input in float32 and rounds the output back to the input's precision:
what the mixed kernels compute (they accumulate in float32) and what a separate run gets.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16,
                                         "fp16": torch.float16}
# torch.amp.GradScaler's defaults.
INIT_SCALE = 2.0 ** 16
GROWTH_FACTOR = 2.0
BACKOFF_FACTOR = 0.5
GROWTH_INTERVAL = 2000


def dtype_of(precision: str) -> torch.dtype | None:
    if precision not in DTYPES:
        raise ValueError(f"unknown precision {precision!r}; valid: {', '.join(DTYPES)}")
    return DTYPES[precision]


class LossScales:
    """Every member's loss scale and growth tracker (float32 and int64 vectors)."""

    def __init__(self, width: int, enabled: bool, device: torch.device) -> None:
        self.enabled = enabled
        self.scale = torch.full((width,), INIT_SCALE if enabled else 1.0,
                                dtype=torch.float32, device=device)
        self.growth = torch.zeros(width, dtype=torch.int64, device=device)

    def update(self, overflowed: Tensor, live: Tensor) -> None:
        """After a step: GradScaler.update per member (`live` members only)."""
        if not self.enabled:
            return
        grown = self.growth + 1
        grow = live & ~overflowed & (grown >= GROWTH_INTERVAL)
        backoff = live & overflowed
        factor = torch.where(backoff, torch.full_like(self.scale, BACKOFF_FACTOR),
                             torch.where(grow, torch.full_like(self.scale, GROWTH_FACTOR),
                                         torch.ones_like(self.scale)))
        new = self.scale * factor
        # As torch: a grown scale that would be infinite is not taken.
        self.scale = torch.where(torch.isfinite(new), new, self.scale)
        self.growth = torch.where(backoff | grow, torch.zeros_like(self.growth),
                                  torch.where(live, grown, self.growth))

    def state_dict(self, index: int) -> dict[str, Any]:
        """Member `index`'s scaler, as `torch.amp.GradScaler.state_dict()` gives it ({}
        without fp16, as a disabled scaler gives)."""
        if not self.enabled:
            return {}
        return {"scale": float(self.scale[index]), "growth_factor": GROWTH_FACTOR,
                "backoff_factor": BACKOFF_FACTOR, "growth_interval": GROWTH_INTERVAL,
                "_growth_tracker": int(self.growth[index])}

    def load(self, index: int, state: dict[str, Any]) -> None:
        if not self.enabled or not state:
            return
        scale = float(state.get("scale", INIT_SCALE))
        if scale > 0 and scale < float("inf"):
            self.scale[index] = scale
        self.growth[index] = max(0, int(state.get("_growth_tracker", 0)))


_Norm = Callable[..., Tensor]


def _in_float32(original: _Norm) -> _Norm:
    def norm(input: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if input.dtype in (torch.float16, torch.bfloat16):
            return original(input.float(), *args, **kwargs).to(input.dtype)
        return original(input, *args, **kwargs)
    return norm


@contextmanager
def norms_in_float32() -> Iterator[None]:
    """While inside, F.layer_norm, F.batch_norm and F.group_norm take a half-precision
    input in float32 (see the module's text). Restored on the way out."""
    saved = F.layer_norm, F.batch_norm, F.group_norm
    F.layer_norm, F.batch_norm, F.group_norm = (_in_float32(f) for f in saved)
    try:
        yield
    finally:
        F.layer_norm, F.batch_norm, F.group_norm = saved
