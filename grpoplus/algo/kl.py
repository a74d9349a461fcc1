"""KL to the reference policy (ALGORITHMS.md section 4).

Registry signature (``KL_ESTIMATORS``)::

    fn(logp, logp_ref, logp_old) -> Tensor[N, T]

per-token estimates of ``KL(pi_theta || pi_ref)``; ``logp`` carries the gradient,
``logp_ref`` and ``logp_old`` do not. Estimators from Schulman 2020, "Approximating KL
Divergence" (blog), with ``l = logp - logp_ref``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from grpoplus.registry import Registry

KLFn = Callable[[Tensor, Tensor, Tensor], Tensor]
KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")

# exp() arguments above this are clamped where two exponentials multiply (k3_is), so the
# product stays finite in float32 for log-ratios up to +-50.
_MAX_LOG_IS = 20.0


@KL_ESTIMATORS.register("k1")
def kl_k1(logp: Tensor, logp_ref: Tensor, logp_old: Tensor) -> Tensor:
    """``k1 = l`` (unbiased, can be negative)."""
    return logp - logp_ref


@KL_ESTIMATORS.register("k2")
def kl_k2(logp: Tensor, logp_ref: Tensor, logp_old: Tensor) -> Tensor:
    """``k2 = l^2 / 2``."""
    return 0.5 * (logp - logp_ref) ** 2


@KL_ESTIMATORS.register("k3")
def kl_k3(logp: Tensor, logp_ref: Tensor, logp_old: Tensor) -> Tensor:
    """``k3 = exp(-l) - 1 + l`` (non-negative). DeepSeekMath (arXiv:2402.03300), eq. 4."""
    log_ratio = logp - logp_ref
    return torch.exp(-log_ratio) - 1.0 + log_ratio


@KL_ESTIMATORS.register("k3_is")
def kl_k3_is(logp: Tensor, logp_ref: Tensor, logp_old: Tensor) -> Tensor:
    """``exp(logp - logp_old) * k3``, the ratio NOT detached (DeepSeek-V3.2 report, unbiased KL estimate).

    Samples come from ``pi_old``: the importance ratio makes both the value and the gradient
    unbiased for ``KL(pi_theta || pi_ref)``. On-policy (``logp == logp_old``) it equals k3.
    The ratio's exponent is clamped at 20 (tokens beyond lose the ratio's gradient).
    """
    ratio = torch.exp((logp - logp_old).clamp(max=_MAX_LOG_IS))
    return ratio * kl_k3(logp, logp_ref, logp_old)


def kl_in_reward(rewards: Tensor, logp: Tensor, logp_ref: Tensor, mask: Tensor, beta: float) -> Tensor:
    """KL placed in the reward: ``R_i - beta * sum_t m (logp - logp_ref)`` (k1), no grad.

    rewards [N]; logp, logp_ref, mask [N, T] -> [N]. Ouyang et al. 2022, InstructGPT
    (arXiv:2203.02155), eq. 2.
    """
    with torch.no_grad():
        k1 = (logp.double() - logp_ref.double()) * mask.double()
        return (rewards.double() - beta * k1.sum(dim=-1)).to(rewards.dtype)


def should_reset_reference(step: int, every: int) -> bool:
    """True on optimizer steps ``every, 2*every, ...`` (``every = 0``: never)."""
    return every > 0 and step > 0 and step % every == 0


def reset_reference(ref_model, policy_model, optimizer=None, reset_optimizer: bool = False) -> None:
    """Reference reset: ``pi_ref <- pi_theta``, optionally clearing the optimizer state.

    ProRL, Liu et al. 2025 (arXiv:2505.24864), sec. 3.2. ``ref_model`` and ``policy_model``
    are ``torch.nn.Module`` of the same architecture.
    """
    if reset_optimizer and optimizer is None:
        raise ValueError("reset_reference(reset_optimizer=True) needs the optimizer")
    with torch.no_grad():
        ref_model.load_state_dict(policy_model.state_dict())
    if reset_optimizer:
        optimizer.state.clear()
