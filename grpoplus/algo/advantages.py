"""Advantage estimators (ALGORITHMS.md section 1).

Registry signature (``ADVANTAGES``)::

    fn(rewards: Tensor[N] float64, group_index: Tensor[N] long in 0..G-1, num_groups: int,
       eps: float) -> Tensor[N]

``compute_advantages`` maps arbitrary group ids to ``group_index``, works in float64 and
removes dropped rows (``keep``) before calling the estimator.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from grpoplus.algo._util import batch_std, dense_groups, group_mean, group_std, group_sum
from grpoplus.registry import Registry

AdvantageFn = Callable[[Tensor, Tensor, int, float], Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


@ADVANTAGES.register("grpo")
def grpo_advantages(rewards: Tensor, group_index: Tensor, num_groups: int, eps: float) -> Tensor:
    """``A_i = (R_i - mean_g R) / (std_g R + eps)``, Bessel std.

    Shao et al. 2024, DeepSeekMath (arXiv:2402.03300), eq. 4 (outcome supervision).
    """
    centred = rewards - group_mean(rewards, group_index, num_groups)
    return centred / (group_std(rewards, group_index, num_groups) + eps)


@ADVANTAGES.register("dr_grpo")
def dr_grpo_advantages(rewards: Tensor, group_index: Tensor, num_groups: int, eps: float) -> Tensor:
    """``A_i = R_i - mean_g R`` (no std division).

    Liu et al. 2025, Understanding R1-Zero-Like Training (Dr. GRPO, arXiv:2503.20783), eq. 3.
    """
    return rewards - group_mean(rewards, group_index, num_groups)


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: Tensor, group_index: Tensor, num_groups: int, eps: float) -> Tensor:
    """``A_i = R_i - (1/(G-1)) sum_{j != i} R_j``; 0 for a group of size 1.

    Ahmadian et al. 2024, Back to Basics: REINFORCE-style optimization (RLOO, arXiv:2402.14740), eq. 5.
    """
    count = group_sum(torch.ones_like(rewards), group_index, num_groups)
    others = group_sum(rewards, group_index, num_groups) - rewards
    adv = rewards - others / (count - 1).clamp(min=1)
    return torch.where(count > 1, adv, torch.zeros_like(adv))


@ADVANTAGES.register("batch_std")
def batch_std_advantages(rewards: Tensor, group_index: Tensor, num_groups: int, eps: float) -> Tensor:
    """``A_i = (R_i - mean_g R) / (std_batch R + eps)``: group mean, batch std.

    Liu et al. 2025, Tricks or Traps? A Deep Dive into RL for LLM Reasoning (Lite PPO, arXiv:2508.08221), sec. 4.1.
    """
    centred = rewards - group_mean(rewards, group_index, num_groups)
    return centred / (batch_std(rewards) + eps)


@ADVANTAGES.register("reinforce_pp")
def reinforce_pp_advantages(rewards: Tensor, group_index: Tensor, num_groups: int, eps: float) -> Tensor:
    """``A = R - mean_g R``, then whitened over the batch: ``(A - mean_B A) / (std_B A + eps)``.

    Hu 2025, REINFORCE++ (arXiv:2501.03262), sec. 3 (the group-baseline variant).
    """
    centred = rewards - group_mean(rewards, group_index, num_groups)
    return (centred - centred.mean()) / (batch_std(centred) + eps)


def _check_rewards(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape [N]; got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )


def compute_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    estimator: str = "grpo",
    eps: float = 1e-6,
    *,
    keep: Tensor | None = None,
) -> Tensor:
    """One advantage per response.  rewards [N], group_ids [N] (any integers) -> [N].

    Groups need not be contiguous or equal in size; a group of size 1 or with equal
    rewards gets advantage 0. ``keep`` [N] bool (optional) drops rows before any
    statistic is taken (GFPO, filtered groups): dropped rows get advantage 0. Computed in
    float64, returned in the rewards' dtype (float32 for integer rewards).
    """
    _check_rewards(rewards, group_ids)
    fn = ADVANTAGES.get(estimator)
    out_dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.float32
    adv = torch.zeros(rewards.shape, dtype=torch.float64, device=rewards.device)
    rows = torch.ones_like(group_ids, dtype=torch.bool) if keep is None else keep.bool()
    if rows.shape != rewards.shape:
        raise ValueError(f"keep must have shape {tuple(rewards.shape)}, got {tuple(rows.shape)}")
    if not bool(rows.any()):
        return adv.to(out_dtype)
    index, num_groups = dense_groups(group_ids[rows])
    adv[rows] = fn(rewards[rows].detach().double(), index, num_groups, eps).double()
    return adv.to(out_dtype)


def group_stats(rewards: Tensor, group_ids: Tensor) -> dict[str, int]:
    """Degenerate-group counts for the trainer's metrics.

    Returns ``groups``, ``size1_groups``, ``zero_spread_groups`` (all rewards equal,
    size-1 groups included), and, counted among the zero-spread groups,
    ``all_correct_groups`` (all rewards 1) and ``all_wrong_groups`` (all rewards 0).
    """
    _check_rewards(rewards, group_ids)
    index, num_groups = dense_groups(group_ids)
    r = rewards.detach().double()
    ones = torch.ones_like(r)
    count = r.new_zeros(num_groups).index_add_(0, index, ones)
    lo = r.new_full((num_groups,), float("inf")).scatter_reduce_(0, index, r, "amin")
    hi = r.new_full((num_groups,), float("-inf")).scatter_reduce_(0, index, r, "amax")
    flat = lo == hi
    return {
        "groups": num_groups,
        "size1_groups": int((count == 1).sum()),
        "zero_spread_groups": int(flat.sum()),
        "all_correct_groups": int((flat & (lo == 1)).sum()),
        "all_wrong_groups": int((flat & (lo == 0)).sum()),
    }


def process_advantages(
    step_rewards: Sequence[Sequence[float]] | Sequence[Tensor],
    step_end_indices: Sequence[Sequence[int]] | Sequence[Tensor],
    group_ids: Tensor,
    T: int,
    eps: float = 1e-6,
) -> Tensor:
    """Process-supervision advantages, one per token.  -> [N, T] float32.

    ``step_rewards[i]`` holds the K_i step rewards of response i, ``step_end_indices[i]``
    the token index (0-based, < T) where each step ends. All step rewards of a group are
    normalised together, ``R~ = (R - mean) / (std + eps)`` (Bessel std), and
    ``A_{i,t} = sum_{k: e_k >= t} R~_{i,k}`` (tokens after the last step get 0).

    Shao et al. 2024, DeepSeekMath (arXiv:2402.03300), sec. 4.1.3 (process supervision).
    """
    n = group_ids.shape[0]
    if len(step_rewards) != n or len(step_end_indices) != n:
        raise ValueError(
            f"step_rewards ({len(step_rewards)}) and step_end_indices ({len(step_end_indices)}) "
            f"must have one entry per response ({n})"
        )
    rewards = [torch.as_tensor(r, dtype=torch.float64).reshape(-1) for r in step_rewards]
    ends = [torch.as_tensor(e, dtype=torch.long).reshape(-1) for e in step_end_indices]
    for i, (r, e) in enumerate(zip(rewards, ends)):
        if r.shape != e.shape:
            raise ValueError(f"response {i}: {r.numel()} step rewards but {e.numel()} step end indices")
        if e.numel() and (int(e.min()) < 0 or int(e.max()) >= T):
            raise ValueError(f"response {i}: step end indices must lie in [0, {T - 1}], got {e.tolist()}")
    flat_r = torch.cat(rewards) if rewards else torch.zeros(0, dtype=torch.float64)
    flat_row = torch.cat([torch.full_like(e, i) for i, e in enumerate(ends)]) if ends else torch.zeros(0, dtype=torch.long)
    flat_end = torch.cat(ends) if ends else torch.zeros(0, dtype=torch.long)
    adv = torch.zeros(n, T, dtype=torch.float64)
    if flat_r.numel() == 0:
        return adv.float().to(group_ids.device)
    index, num_groups = dense_groups(group_ids.cpu()[flat_row])
    norm_r = grpo_advantages(flat_r, index, num_groups, eps)
    # A_{i,t} = sum over steps ending at or after t: add R~ at e_k, then reverse cumsum over t.
    adv.index_put_((flat_row, flat_end), norm_r, accumulate=True)
    adv = adv.flip(-1).cumsum(-1).flip(-1)
    return adv.float().to(group_ids.device)
