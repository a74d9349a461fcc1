"""Small tensor helpers shared by the algorithm modules (masked sums, group statistics).

Shapes: ``N`` responses, ``T`` response tokens, ``G`` groups (prompts).
"""

from __future__ import annotations

import torch
from torch import Tensor


def work_dtype(x: Tensor) -> torch.dtype:
    """At least float32: losses of bfloat16/float16 inputs are computed in float32."""
    return torch.promote_types(x.dtype, torch.float32)


def row_sum(x: Tensor, mask: Tensor) -> Tensor:
    """``sum_t m x`` per response.  x, mask: [N, T] -> [N]."""
    return (x * mask).sum(dim=-1)


def row_count(mask: Tensor) -> Tensor:
    """``|o_i| = sum_t m``.  [N, T] -> [N] (float)."""
    return mask.float().sum(dim=-1)


def row_mean(x: Tensor, mask: Tensor) -> Tensor:
    """``(1/|o_i|) sum_t m x`` per response, 0 for an empty response.  [N, T] -> [N]."""
    return row_sum(x, mask) / row_count(mask).clamp(min=1).to(x.dtype)


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``x`` over the unmasked entries; 0 when every entry is masked."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Max of ``x`` over the unmasked entries; 0 when every entry is masked."""
    if not bool(mask.any()):
        return x.new_zeros(())
    return x[mask.bool()].max()


def masked_min(x: Tensor, mask: Tensor) -> Tensor:
    """Min of ``x`` over the unmasked entries; 0 when every entry is masked."""
    if not bool(mask.any()):
        return x.new_zeros(())
    return x[mask.bool()].min()


def fraction(part: Tensor, whole: Tensor) -> Tensor:
    """``|part| / |whole|`` for boolean tensors; 0 when ``whole`` is empty."""
    return part.float().sum() / whole.float().sum().clamp(min=1)


def dense_groups(group_ids: Tensor) -> tuple[Tensor, int]:
    """Map arbitrary integer group ids [N] to ``0..G-1`` (order of sorted id); returns (index [N], G)."""
    if group_ids.dim() != 1:
        raise ValueError(f"group_ids must have shape [N], got {tuple(group_ids.shape)}")
    if group_ids.dtype.is_floating_point or group_ids.dtype == torch.bool:
        raise ValueError(f"group_ids must be an integer tensor, got dtype {group_ids.dtype}")
    uniq, index = torch.unique(group_ids, return_inverse=True)
    return index, int(uniq.numel())


def group_sum(x: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """Per-group sum, gathered back to rows.  x [N], index [N] in 0..G-1 -> [N]."""
    sums = x.new_zeros(num_groups).index_add_(0, index, x)
    return sums[index]


def group_mean(x: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """``mean_g x`` gathered back to rows.  [N] -> [N]."""
    count = group_sum(torch.ones_like(x), index, num_groups)
    return group_sum(x, index, num_groups) / count


def group_std(x: Tensor, index: Tensor, num_groups: int) -> Tensor:
    """``std_g x`` with Bessel's correction, gathered back to rows; 0 for a group of size 1.  [N] -> [N]."""
    count = group_sum(torch.ones_like(x), index, num_groups)
    centred = x - group_mean(x, index, num_groups)
    var = group_sum(centred * centred, index, num_groups) / (count - 1).clamp(min=1)
    return var.sqrt()


def batch_std(x: Tensor) -> Tensor:
    """Std over the whole batch with Bessel's correction; 0 for a single element."""
    if x.numel() < 2:
        return x.new_zeros(())
    return x.std(unbiased=True)
