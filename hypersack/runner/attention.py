"""Attention for fused groups: `scaled_dot_product_attention` as matrix products and a
softmax, which `vmap` batches, instead of PyTorch's fused attention kernels, which it
does not (no batching rule: `vmap` ran them once per member in a Python loop, with a
"performance drop" warning). Under `batched_attention()` every attention call of the
zoo's transformers (nn.MultiheadAttention, the Pythia blocks) runs for all members of a
group at once: the member dimension is folded into the batch of one `bmm` per product.

The formula is the one PyTorch documents for `scaled_dot_product_attention` (its math
backend): softmax(q k^T * scale + mask) v, the mask boolean (True: attend) or added,
causal as a lower triangle, dropout on the weights. A group's members therefore equal
separate runs as the fp32/fp64 equality tests check (to rounding: a separate run may use
a fused kernel that sums in another order).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor


def math_attention(query: Tensor, key: Tensor, value: Tensor,
                   attn_mask: Tensor | None = None, dropout_p: float = 0.0,
                   is_causal: bool = False, scale: float | None = None,
                   enable_gqa: bool = False) -> Tensor:
    """`F.scaled_dot_product_attention`'s result, from operations `vmap` batches."""
    length, source = query.shape[-2], key.shape[-2]
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeat, dim=-3)
        value = value.repeat_interleave(repeat, dim=-3)
    factor = 1 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * factor
    if is_causal:
        keep = torch.ones(length, source, dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(~keep, -math.inf)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, -math.inf)
        else:
            scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p, training=True)
    return torch.matmul(weights, value)


_Sdpa = Callable[..., Tensor]


@contextmanager
def batched_attention() -> Iterator[None]:
    """While inside, `F.scaled_dot_product_attention` is `math_attention`, and
    nn.MultiheadAttention's fused fast path (one kernel, no batching rule either) is
    off. Restored on the way out, also after an error."""
    original: _Sdpa = F.scaled_dot_product_attention
    fastpath = torch.backends.mha.get_fastpath_enabled()
    F.scaled_dot_product_attention = math_attention
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original
        torch.backends.mha.set_fastpath_enabled(fastpath)

