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

from grpoplus.algo.registries import KL_ESTIMATORS

KLFn = Callable[[Tensor, Tensor, Tensor], Tensor]

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


kl_k3_is.ratio_dependent = True  # with one update per batch r = 1 and it equals k3


def kl_in_reward(rewards: Tensor, logp: Tensor, logp_ref: Tensor, mask: Tensor, beta: float) -> Tensor:
    """KL placed in the reward: ``R_i - beta * sum_t m (logp - logp_ref)`` (k1), no grad.

    rewards [N]; logp, logp_ref, mask [N, T] -> [N]. Ouyang et al. 2022, InstructGPT
    (arXiv:2203.02155), eq. 2.
    """
    with torch.no_grad():
        k1 = (logp.double() - logp_ref.double()) * mask.double()
        return (rewards.double() - beta * k1.sum(dim=-1)).to(rewards.dtype)


def should_reset_reference(step: int, every: int) -> bool:
    """True on steps ``every, 2*every, ...`` (``every = 0``: never): when to call :func:`update_reference`."""
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


def _matching_parameters(ref_model, policy_model) -> list[tuple[torch.nn.Parameter, torch.nn.Parameter]]:
    ref, pol = dict(ref_model.named_parameters()), dict(policy_model.named_parameters())
    if ref.keys() != pol.keys():
        missing = sorted(set(ref) ^ set(pol))[:3]
        raise ValueError(f"reference and policy models differ in their parameters (e.g. {missing}); "
                         "the reference must be a copy of the policy's architecture")
    return [(ref[name], pol[name]) for name in ref]


def soft_update_reference(ref_model, policy_model, alpha: float) -> None:
    """Soft reference update ``pi_ref <- alpha * pi_theta + (1 - alpha) * pi_ref``, parameter by parameter.

    Gorbatovski et al. 2024, Learn Your Reference Model for Real Good Alignment (TR-DPO,
    arXiv:2404.09656), the soft update; as TRL ``sync_ref_model`` with
    ``ref_model_mixup_alpha``. Parameters only (buffers are left as they are, as TRL); tied
    weights are mixed once. ``alpha = 1`` copies the policy's parameters.
    """
    if not 0 < alpha <= 1:
        raise ValueError(f"soft_update_reference needs 0 < alpha <= 1, got {alpha}")
    with torch.no_grad():
        for ref, pol in _matching_parameters(ref_model, policy_model):
            ref.mul_(1.0 - alpha).add_(pol.detach().to(ref.dtype), alpha=alpha)


def update_reference(ref_model, policy_model, alpha: float = 1.0, optimizer=None, reset_optimizer: bool = False) -> None:
    """The reference update of ``AlgoConfig.ref_update_alpha``: ``alpha = 1`` is ProRL's hard reset
    (:func:`reset_reference`, optionally clearing the optimizer state), ``alpha < 1`` the TR-DPO
    soft update (:func:`soft_update_reference`; the optimizer is never reset then).
    """
    if alpha == 1.0:
        reset_reference(ref_model, policy_model, optimizer, reset_optimizer)
    elif reset_optimizer:
        raise ValueError("reset_optimizer goes with the hard reset (alpha = 1), not with a soft update")
    else:
        soft_update_reference(ref_model, policy_model, alpha)
