"""Advantage estimators (ALGORITHMS.md section 1).

Registry signature (``ADVANTAGES``)::

    fn(rewards: Tensor[N] float64, group_index: Tensor[N] long in 0..G-1, num_groups: int,
       eps: float) -> Tensor[N]

``compute_advantages`` maps arbitrary group ids to ``group_index``, works in float64 and
removes dropped rows (``keep``) before calling the estimator. An estimator marked with
:func:`batch_whitened` returns its group stage only; ``compute_advantages`` then whitens it
over the batch: over the responses (``(A - mean) / (std + eps)``), or over the valid tokens
when a ``token_mask`` is given (REINFORCE++ as in its paper and verl). ``compute_advantages_multi``
is GDPO: several reward components, each normalised within its group, summed, then whitened.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import Tensor

from grpoplus.algo._util import batch_std, dense_groups, group_mean, group_std, group_sum
from grpoplus.algo.registries import ADVANTAGES

AdvantageFn = Callable[[Tensor, Tensor, int, float], Tensor]

# Variance floor of the token whitening, as verl's ``masked_whiten``: (x - mean) / sqrt(var + 1e-8).
_TOKEN_WHITEN_VAR_EPS = 1e-8


def batch_whitened(fn: AdvantageFn) -> AdvantageFn:
    """Mark an estimator whose output ``compute_advantages`` whitens over the batch."""
    fn.batch_whitened = True
    return fn


def group_relative(fn: AdvantageFn) -> AdvantageFn:
    """Mark an estimator whose baseline is taken within the group: a group of one response gets
    advantage 0, so ``rollout.group_size=1`` is rejected when the config is validated."""
    fn.group_relative = True
    return fn


@ADVANTAGES.register("grpo")
@group_relative
def grpo_advantages(rewards: Tensor, group_index: Tensor, num_groups: int, eps: float) -> Tensor:
    """``A_i = (R_i - mean_g R) / (std_g R + eps)``, Bessel std.

    Shao et al. 2024, DeepSeekMath (arXiv:2402.03300), eq. 4 (outcome supervision).
    """
    centred = rewards - group_mean(rewards, group_index, num_groups)
    return centred / (group_std(rewards, group_index, num_groups) + eps)


@ADVANTAGES.register("dr_grpo")
@group_relative
def dr_grpo_advantages(rewards: Tensor, group_index: Tensor, num_groups: int, eps: float) -> Tensor:
    """``A_i = R_i - mean_g R`` (no std division).

    Liu et al. 2025, Understanding R1-Zero-Like Training (Dr. GRPO, arXiv:2503.20783), eq. 3.
    """
    return rewards - group_mean(rewards, group_index, num_groups)


@ADVANTAGES.register("rloo")
@group_relative
def rloo_advantages(rewards: Tensor, group_index: Tensor, num_groups: int, eps: float) -> Tensor:
    """``A_i = R_i - (1/(G-1)) sum_{j != i} R_j``; 0 for a group of size 1.

    Ahmadian et al. 2024, Back to Basics: REINFORCE-style optimization (RLOO, arXiv:2402.14740), eq. 5.
    """
    count = group_sum(torch.ones_like(rewards), group_index, num_groups)
    others = group_sum(rewards, group_index, num_groups) - rewards
    adv = rewards - others / (count - 1).clamp(min=1)
    return torch.where(count > 1, adv, torch.zeros_like(adv))


@ADVANTAGES.register("batch_std")
@group_relative
def batch_std_advantages(rewards: Tensor, group_index: Tensor, num_groups: int, eps: float) -> Tensor:
    """``A_i = (R_i - mean_g R) / (std_batch R + eps)``: group mean, batch std.

    Liu et al. 2025, Tricks or Traps? A Deep Dive into RL for LLM Reasoning (Lite PPO, arXiv:2508.08221), sec. 4.1.
    """
    centred = rewards - group_mean(rewards, group_index, num_groups)
    return centred / (batch_std(rewards) + eps)


@ADVANTAGES.register("reinforce_pp")
@group_relative
@batch_whitened
def reinforce_pp_advantages(rewards: Tensor, group_index: Tensor, num_groups: int, eps: float) -> Tensor:
    """``A = R - mean_g R``, then (in ``compute_advantages``) whitened over the batch.

    Over responses: ``(A - mean_B A) / (std_B A + eps)``; over tokens (``token_mask`` given):
    :func:`whiten_tokens`. Hu 2025, REINFORCE++ (arXiv:2501.03262), sec. 3 (the
    group-baseline variant).
    """
    return rewards - group_mean(rewards, group_index, num_groups)


def whiten_responses(adv: Tensor, eps: float) -> Tensor:
    """``(A - mean A) / (std A + eps)`` over the responses (Bessel std).  [N] -> [N]."""
    return (adv - adv.mean()) / (batch_std(adv) + eps)


def whiten_tokens(adv: Tensor, token_mask: Tensor) -> Tensor:
    """Whitening over the valid tokens: ``A_i`` counted ``|o_i|`` times.  adv [N], token_mask [N, T] -> [N, T].

    ``mean = sum_i |o_i| A_i / n``, ``var = sum_i |o_i| (A_i - mean)^2 / (n - 1)`` (``n`` valid
    tokens), ``A~_{i,t} = m_{i,t} (A_i - mean) / sqrt(var + 1e-8)`` (verl ``masked_whiten``);
    all zero when ``n < 2``. REINFORCE++ (arXiv:2501.03262), sec. 3, whitens the token-level
    advantages this way: a long response weighs more in the mean and the variance.
    """
    m = token_mask.to(torch.float64)
    n = float(m.sum())
    if n < 2:
        return torch.zeros_like(m)
    lengths = m.sum(dim=-1)  # [N]
    mean = (lengths * adv).sum() / n
    var = (lengths * (adv - mean) ** 2).sum() / (n - 1)
    return ((adv - mean) / torch.sqrt(var + _TOKEN_WHITEN_VAR_EPS))[:, None] * m


def _check_rewards(rewards: Tensor, group_ids: Tensor) -> None:
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape [N]; got {tuple(rewards.shape)} and {tuple(group_ids.shape)}"
        )


def _rows(keep: Tensor | None, rewards: Tensor) -> Tensor:
    rows = torch.ones(rewards.shape[0], dtype=torch.bool, device=rewards.device) if keep is None else keep.bool()
    if rows.shape != rewards.shape[:1]:
        raise ValueError(f"keep must have shape [N]={rewards.shape[0]}, got {tuple(rows.shape)}")
    return rows


def _finish(adv: Tensor, rows: Tensor, whiten: bool, eps: float, token_mask: Tensor | None) -> Tensor:
    """Batch whitening of the kept rows (when ``whiten``), then [N] or, with ``token_mask``, [N, T]."""
    if token_mask is None:
        if whiten and bool(rows.any()):
            adv[rows] = whiten_responses(adv[rows], eps)
        return adv
    if token_mask.dim() != 2 or token_mask.shape[0] != adv.shape[0]:
        raise ValueError(f"token_mask must have shape [N={adv.shape[0]}, T], got {tuple(token_mask.shape)}")
    tokens = token_mask.bool() & rows[:, None]
    return whiten_tokens(adv, tokens) if whiten else adv[:, None] * tokens


def compute_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    estimator: str = "grpo",
    eps: float = 1e-6,
    *,
    keep: Tensor | None = None,
    token_mask: Tensor | None = None,
) -> Tensor:
    """One advantage per response.  rewards [N], group_ids [N] (any integers) -> [N], or [N, T].

    Groups need not be contiguous or equal in size; a group of size 1 or with equal
    rewards gets advantage 0. ``keep`` [N] bool (optional) drops rows before any
    statistic is taken (GFPO, filtered groups): dropped rows get advantage 0.
    ``token_mask`` [N, T] (optional): the result is per token, ``A_i`` on the valid tokens of
    row i and 0 elsewhere, and the batch whitening of a :func:`batch_whitened` estimator runs
    over those tokens instead of the responses (``AlgoConfig.adv_whiten="token"``).
    Computed in float64, returned in the rewards' dtype (float32 for integer rewards).
    """
    _check_rewards(rewards, group_ids)
    fn = ADVANTAGES.get(estimator)
    out_dtype = rewards.dtype if rewards.dtype.is_floating_point else torch.float32
    adv = torch.zeros(rewards.shape, dtype=torch.float64, device=rewards.device)
    rows = _rows(keep, rewards)
    if bool(rows.any()):
        index, num_groups = dense_groups(group_ids[rows])
        adv[rows] = fn(rewards[rows].detach().double(), index, num_groups, eps).double()
    return _finish(adv, rows, getattr(fn, "batch_whitened", False), eps, token_mask).to(out_dtype)


def compute_advantages_multi(
    components: Tensor,
    group_ids: Tensor,
    weights: Tensor | Sequence[float] | None = None,
    estimator: str = "grpo",
    eps: float = 1e-6,
    *,
    keep: Tensor | None = None,
    token_mask: Tensor | None = None,
) -> Tensor:
    """GDPO: each reward component normalised within its group, weighted, summed, then whitened.

    components [N, K] (one column per reward), weights [K] (default 1), group_ids [N] -> [N]
    (or [N, T] with ``token_mask``). Per component ``A_k = estimator(R_k)`` (its group stage for
    a :func:`batch_whitened` estimator), ``A = sum_k w_k A_k``, then ``(A - mean A) / (std A + eps)``
    over the responses, or :func:`whiten_tokens` over the valid tokens with ``token_mask``.
    GDPO, Group reward-Decoupled Normalization Policy Optimization (arXiv:2601.05242): summing
    first gives combinations with equal totals equal advantages and lets the component with
    the widest spread dominate; normalising each component within its group first puts every
    component on the same scale. With
    ``estimator="grpo"`` and ``eps=1e-4`` this is TRL ``multi_objective_aggregation=
    "normalize_then_sum"``; with ``token_mask`` and ``eps=1e-6`` it is verl ``gdpo``.
    """
    if components.dim() != 2 or components.shape[0] != group_ids.shape[0]:
        raise ValueError(f"components must have shape [N={group_ids.shape[0]}, K], got {tuple(components.shape)}")
    k = components.shape[1]
    w = torch.ones(k, dtype=torch.float64) if weights is None else torch.as_tensor(weights, dtype=torch.float64).reshape(-1)
    if w.numel() != k:
        raise ValueError(f"weights must have one entry per reward component ({k}), got {w.numel()}")
    _check_rewards(components[:, 0], group_ids)
    fn = ADVANTAGES.get(estimator)
    out_dtype = components.dtype if components.dtype.is_floating_point else torch.float32
    total = torch.zeros(components.shape[0], dtype=torch.float64, device=components.device)
    rows = _rows(keep, components[:, 0])
    if bool(rows.any()):
        index, num_groups = dense_groups(group_ids[rows])
        parts = [fn(components[rows, j].detach().double(), index, num_groups, eps).double() for j in range(k)]
        total[rows] = sum(float(w[j]) * parts[j] for j in range(k))
    return _finish(total, rows, True, eps, token_mask).to(out_dtype)


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


def return_to_go_advantages(
    step_rewards: Sequence[Sequence[float]] | Sequence[Tensor],
    step_end_indices: Sequence[Sequence[int]] | Sequence[Tensor],
    group_ids: Tensor,
    T: int,
) -> Tensor:
    """Turn-level credit with one baseline per trajectory.  -> [N, T] float32.

    ``G_{i,t} = sum_{k: e_k >= t} R_{i,k}`` (the rewards of the steps from t on) and
    ``A_{i,t} = G_{i,t} - mean_g G_{.,0}`` (the group's mean whole return; tokens after the last step get
    ``-mean``, masked out by the loss anyway). No std division (as Dr. GRPO, arXiv:2503.20783): a group whose whole
    returns agree has std 0 while its returns-to-go still differ within a trajectory.

    Unlike :func:`process_advantages`, which subtracts the group's mean step reward once per step a trajectory
    takes (a baseline whose size the policy chooses by when it stops, so an extra turn is rewarded or punished by
    ``-mean``: verl RFC #7244), the baseline here is one number per group, independent of the trajectory's actions:
    REINFORCE with a baseline (Williams 1992) on the return-to-go, an unbiased policy gradient.
    """
    n = group_ids.shape[0]
    if len(step_rewards) != n or len(step_end_indices) != n:
        raise ValueError(f"step_rewards ({len(step_rewards)}) and step_end_indices ({len(step_end_indices)}) "
                         f"must have one entry per response ({n})")
    togo = torch.zeros(n, T, dtype=torch.float64)
    for i, (r, e) in enumerate(zip(step_rewards, step_end_indices)):
        r = torch.as_tensor(r, dtype=torch.float64).reshape(-1)
        e = torch.as_tensor(e, dtype=torch.long).reshape(-1)
        if r.shape != e.shape:
            raise ValueError(f"response {i}: {r.numel()} step rewards but {e.numel()} step end indices")
        if e.numel() and (int(e.min()) < 0 or int(e.max()) >= T):
            raise ValueError(f"response {i}: step end indices must lie in [0, {T - 1}], got {e.tolist()}")
        togo[i].index_put_((e,), r, accumulate=True)
    togo = togo.flip(-1).cumsum(-1).flip(-1)  # G_{i,t}
    index, num_groups = dense_groups(group_ids.cpu())
    whole = togo[:, 0]
    count = whole.new_zeros(num_groups).index_add_(0, index, torch.ones_like(whole))
    mean = whole.new_zeros(num_groups).index_add_(0, index, whole) / count
    return (togo - mean[index, None]).float().to(group_ids.device)
