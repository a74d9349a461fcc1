"""Sampling-side tricks (ALGORITHMS.md section 6) as pure functions on tensors.

The trainer calls these between rollout and update; none of them needs the model.
Shapes: ``N`` responses, ``T`` response tokens.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from grpoplus.algo._util import dense_groups
from grpoplus.algo.config import overlong_cache_len


def _group_min_max(rewards: Tensor, group_ids: Tensor, scored: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-row min and max of its group's scored rewards (inf, -inf for a group with none).  [N] -> ([N], [N])."""
    index, num_groups = dense_groups(group_ids)
    r = rewards.detach().double()
    low, high = r, r
    if scored is not None:  # an unscored row moves neither bound
        low = torch.where(scored.bool(), r, torch.full_like(r, math.inf))
        high = torch.where(scored.bool(), r, torch.full_like(r, -math.inf))
    lo = r.new_full((num_groups,), math.inf).scatter_reduce_(0, index, low, "amin")
    hi = r.new_full((num_groups,), -math.inf).scatter_reduce_(0, index, high, "amax")
    return lo[index], hi[index]


def zero_variance_groups(rewards: Tensor, group_ids: Tensor, scored: Tensor | None = None) -> Tensor:
    """True for the rows of groups whose rewards are all equal (groups of size 1 included).

    rewards [N], group_ids [N] -> bool [N]. Such groups have zero advantage and add no
    signal. Zero-variance filtering without refill drops them (Xiong et al. 2025,
    Reinforce-Rej, arXiv:2504.11343, sec. 3). ``scored`` [N] bool (optional): only those rows
    count, so a group with fewer than 2 scored rows has no spread.
    """
    lo, hi = _group_min_max(rewards, group_ids, scored)
    return ~(lo < hi)


def dynamic_sampling_keep(rewards: Tensor, group_ids: Tensor, max_groups: int | None = None,
                          scored: Tensor | None = None) -> Tensor:
    """Rows to keep under DAPO dynamic sampling: groups with non-zero reward spread.

    rewards [N], group_ids [N] -> bool [N]. With ``max_groups``, only the first
    ``max_groups`` such groups (in order of first appearance) are kept, so the trainer can
    fill a batch of exactly B groups from over-sampled rounds; ``scored`` as in
    :func:`zero_variance_groups`. DAPO (arXiv:2503.14476), eq. 11.
    """
    keep = ~zero_variance_groups(rewards, group_ids, scored)
    if max_groups is None:
        return keep
    seen: dict[int, int] = {}
    for gid in group_ids[keep].tolist():
        seen.setdefault(gid, len(seen))
    allowed = torch.tensor([seen.get(g, max_groups) < max_groups for g in group_ids.tolist()], dtype=torch.bool)
    return keep & allowed.to(keep.device)


def overlong_filter_mask(mask: Tensor, finished: Tensor) -> Tensor:
    """Overlong filtering: zero the mask of responses cut by the length limit.

    mask [N, T], finished [N] bool (True when the response ended with EOS) -> mask [N, T]
    of the same dtype. DAPO (arXiv:2503.14476), sec. 3.4.
    """
    if finished.shape != mask.shape[:1]:
        raise ValueError(f"finished must have shape [N]={mask.shape[0]}, got {tuple(finished.shape)}")
    return mask * finished.bool()[:, None].to(mask.dtype) if mask.dtype != torch.bool else mask & finished.bool()[:, None]


def soft_overlong_penalty(lengths: Tensor, max_len: int, cache: int | None = None) -> Tensor:
    """DAPO soft overlong punishment, added to the reward.  lengths [N] -> [N] float32.

    ``0`` if ``L <= L_max - L_cache``; ``((L_max - L_cache) - L) / L_cache`` if
    ``L_max - L_cache < L <= L_max``; ``-1`` if ``L > L_max``. ``cache=None`` uses
    ``L_cache = max(1, L_max // 4)`` (as ``AlgoConfig.cache_len``). DAPO (arXiv:2503.14476), eq. 13.
    """
    cache = overlong_cache_len(max_len, cache)
    if not 0 < cache <= max_len:
        raise ValueError(f"soft_overlong_penalty needs 0 < cache <= max_len, got cache={cache}, max_len={max_len}")
    length = lengths.double()
    start = max_len - cache
    ramp = (start - length) / cache
    penalty = torch.where(length <= start, torch.zeros_like(length), ramp)
    return torch.where(length > max_len, torch.full_like(length, -1.0), penalty).float()


def gfpo_select(rewards: Tensor, lengths: Tensor, group_ids: Tensor, k: int, metric: str = "length") -> Tensor:
    """GFPO: keep the ``k`` best responses of each group.  -> bool [N] (kept rows).

    ``metric="length"``: the k shortest; ``"reward_per_token"``: the k with the highest
    ``reward / length``. Ties go to the earlier row; a group with at most k responses is
    kept whole. Compute the advantages over the kept rows only
    (``compute_advantages(..., keep=kept)``) and zero the mask of the others.
    Shrivastava et al. 2025, Group Filtered Policy Optimization (arXiv:2508.09726), eq. 2.
    """
    if k < 1:
        raise ValueError(f"gfpo_select needs k >= 1, got {k}")
    if metric == "length":
        score = -lengths.double()
    elif metric == "reward_per_token":
        score = rewards.double() / lengths.double().clamp(min=1)
    else:
        raise ValueError(f"gfpo_select: unknown metric {metric!r}; choose one of: length, reward_per_token")
    index, _ = dense_groups(group_ids)
    n = score.shape[0]
    # Sort by (group, -score, row) and keep the first k of each group.
    order = torch.arange(n, device=score.device)
    by_score = torch.argsort(-score, stable=True)
    by_group = by_score[torch.argsort(index[by_score], stable=True)]
    sorted_groups = index[by_group]
    first = torch.searchsorted(sorted_groups, sorted_groups, right=False)
    rank = order - first  # position within the group
    kept = torch.zeros(n, dtype=torch.bool, device=score.device)
    kept[by_group] = rank < k
    return kept


def high_entropy_mask(entropy: Tensor, mask: Tensor, rho: float) -> Tensor:
    """Keep only the tokens whose entropy is in the top ``rho`` fraction of the batch.

    entropy, mask [N, T] -> mask [N, T] (same dtype). ``ceil(rho * n)`` of the ``n``
    unmasked tokens are kept (ties at the threshold are all kept); ``rho = 1`` keeps all.
    Wang et al. 2025, Beyond the 80/20 Rule (arXiv:2506.01939), eq. 6.
    """
    if not 0 < rho <= 1:
        raise ValueError(f"high_entropy_mask needs 0 < rho <= 1, got {rho}")
    active = mask.bool()
    n = int(active.sum())
    if rho >= 1.0 or n == 0:
        return mask
    k = max(1, math.ceil(rho * n))
    threshold = torch.topk(entropy.detach()[active].float(), k).values.min()
    keep = active & (entropy.detach().float() >= threshold)
    return keep if mask.dtype == torch.bool else keep.to(mask.dtype)
