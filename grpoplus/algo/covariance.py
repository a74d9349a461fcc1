"""Token selections of Clip-Cov and KL-Cov (Cui et al. 2025, The Entropy Mechanism of
Reinforcement Learning for Reasoning Language Models, arXiv:2505.22617, sec. 4).

The entropy of a softmax policy falls by about ``Cov(logp, A)`` per update: the tokens
whose centred log-prob and centred advantage have the largest product drive entropy
collapse. Both methods restrain a small fraction ``cov_ratio`` of those tokens.

Selector signature (a loss marked with :func:`grpoplus.algo.losses.selects_tokens`)::

    select(advantages, logp, logp_old, mask, *, generator, **params) -> Tensor[N, T] bool

All tensors [N, T] and detached; ``mask`` is bool; ``logp`` is ``sg[logp]`` when the
batch is one micro-batch, and ``logp_old`` when the selection is made once per optimizer
step by ``prepare_loss`` (at the start of a batch's first update they are equal). The
statistics (means, the count ``k``, the candidates) are over the unmasked tokens of the
whole batch given, so the selection does not depend on how it is later split.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpoplus.algo._util import masked_mean


def token_covariance(advantages: Tensor, logp: Tensor, mask: Tensor) -> Tensor:
    """``(A - mean A)(logp - mean logp)`` per token, means over the unmasked tokens.  [N, T]."""
    return (advantages - masked_mean(advantages, mask)) * (logp - masked_mean(logp, mask))


def _ppo_clip_binds(ratio: Tensor, advantages: Tensor, eps_low: float, eps_high: float) -> Tensor:
    """True where the clipped branch of ``max(-r A, -clip(r) A)`` is strictly the larger."""
    return -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high) > -advantages * ratio


def clip_cov_select(advantages, logp, logp_old, mask, *, generator: torch.Generator | None, cov_ratio: float,
                    cov_lb: float, cov_ub: float, eps_low: float, eps_high: float, **_) -> Tensor:
    """Clip-Cov: a random subset of the tokens with ``cov_lb < cov < cov_ub`` (tokens the PPO
    clip already stops are not candidates); its size is ``min(max(int(cov_ratio * n), 1), #candidates)``
    with ``n`` the unmasked tokens. The subset is the first ``k`` of ``randperm(#candidates,
    generator)`` over the candidates in row-major order (as verl ``clip_cov``); ``generator`` is a
    CPU ``torch.Generator``, None means a fresh one seeded 0.
    """
    selected = torch.zeros_like(mask)
    n = int(mask.sum())
    if n == 0:
        return selected
    cov = token_covariance(advantages, logp, mask)
    clipped = _ppo_clip_binds(torch.exp(logp - logp_old), advantages, eps_low, eps_high)
    candidates = torch.nonzero(mask & ~clipped & (cov > cov_lb) & (cov < cov_ub))  # [C, 2], row-major
    k = min(max(int(cov_ratio * n), 1), len(candidates))
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[:k].to(candidates.device)]
    selected[chosen[:, 0], chosen[:, 1]] = True
    return selected


def kl_cov_select(advantages, logp, logp_old, mask, *, cov_ratio: float, **_) -> Tensor:
    """KL-Cov: the ``max(1, int(cov_ratio * n))`` unmasked tokens with the largest covariance (as verl ``kl_cov``)."""
    selected = torch.zeros_like(mask)
    n = int(mask.sum())
    if n == 0:
        return selected
    cov = token_covariance(advantages, logp, mask)[mask]  # [n], row-major
    top = torch.topk(cov, max(1, int(n * cov_ratio))).indices
    rows, cols = torch.nonzero(mask, as_tuple=True)
    selected[rows[top], cols[top]] = True
    return selected
