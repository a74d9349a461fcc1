"""Per-token policy losses (ALGORITHMS.md section 2), minimised.

Registry signature (``LOSSES``)::

    fn(logp, logp_old, advantages, mask, *, eps_low, eps_high, dual_clip_c, pg_cap)
        -> (loss, stats)

``logp`` [N, T] carries the gradient; ``logp_old``, ``advantages`` [N, T] and ``mask``
[N, T] (float 0/1) do not. ``loss`` is [N, T] per token, or [N] per response when the
function is marked with :func:`per_sequence` (it is then averaged over the responses that
keep a token). ``stats`` maps a metric name to a 0-dim tensor; the facade reports it as
``loss/<name>``. Every built-in loss reports ``clip_frac_low`` (``A<0`` and ratio below
the trust region) and ``clip_frac_high`` (``A>0`` and ratio above it). A loss never
normalises itself: aggregation is separate (``aggregation.py``).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from grpoplus.algo._util import fraction, row_mean
from grpoplus.registry import Registry

LossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]
LOSSES: Registry[LossFn] = Registry("policy loss")


def per_sequence(fn: LossFn) -> LossFn:
    """Mark a loss as producing one value per response ([N]) instead of per token."""
    fn.per_sequence = True
    return fn


def _clip_fracs(ratio: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> dict[str, Tensor]:
    """Token fractions clipped at the low side (A<0, ratio<low) and high side (A>0, ratio>high)."""
    with torch.no_grad():
        active = mask > 0
        return {
            "clip_frac_low": fraction(active & (adv < 0) & (ratio < low), active),
            "clip_frac_high": fraction(active & (adv > 0) & (ratio > high), active),
        }


def _clipped_objective(ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, dual_clip_c: float | None) -> Tensor:
    """``-min(r A, clip(r, 1-eps_low, 1+eps_high) A)``, with the optional dual clip for A<0.

    Schulman et al. 2017, PPO (arXiv:1707.06347), eq. 7; dual clip: Ye et al. 2020
    (arXiv:1912.09729), eq. 5: for ``A<0`` the loss is capped at ``-c A``.
    """
    unclipped = -ratio * adv
    clipped = -ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv
    loss = torch.maximum(unclipped, clipped)
    if dual_clip_c is not None:
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip_c * adv), loss)
    return loss


@LOSSES.register("clip")
def clip_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, dual_clip_c=None, pg_cap=None):
    """PPO/GRPO clipped surrogate; clip-higher when ``eps_high > eps_low``.

    ``L = -min(r A, clip(r, 1-eps_low, 1+eps_high) A)``, ``r = exp(logp - logp_old)``.
    DeepSeekMath (arXiv:2402.03300) eq. 3; clip-higher: DAPO (arXiv:2503.14476) sec. 3.1.
    """
    ratio = torch.exp(logp - logp_old)  # [N, T]
    loss = _clipped_objective(ratio, advantages, eps_low, eps_high, dual_clip_c)
    return loss, _clip_fracs(ratio.detach(), advantages, mask, 1.0 - eps_low, 1.0 + eps_high)


@LOSSES.register("gspo_token")
def gspo_token_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, dual_clip_c=None, pg_cap=None):
    """GSPO-token: sequence ratio with a per-token advantage.

    ``s_i = exp((1/|o_i|) sum_t m (logp - logp_old))``; ``s_{i,t} = sg[s_i] exp(logp - sg[logp])``
    (value ``s_i``, gradient ``s_i * grad logp_t``); ``L = -min(s_{i,t} A_{i,t}, clip(s_{i,t}) A_{i,t})``.
    Zheng et al. 2025, GSPO (arXiv:2507.18071), eq. 7 and 13-14.
    """
    seq_ratio = torch.exp(row_mean(logp - logp_old, mask)).detach()  # [N]
    ratio = seq_ratio[:, None] * torch.exp(logp - logp.detach())  # [N, T]
    loss = _clipped_objective(ratio, advantages, eps_low, eps_high, dual_clip_c)
    return loss, _clip_fracs(ratio.detach(), advantages, mask, 1.0 - eps_low, 1.0 + eps_high)


@LOSSES.register("gspo")
def gspo_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, dual_clip_c=None, pg_cap=None):
    """GSPO with one advantage per response: the row's masked mean of ``advantages``.

    With a constant ``A_i`` over the tokens, GSPO-token equals sequence-level GSPO in value
    and gradient (GSPO, arXiv:2507.18071, sec. 4.3), so whole sequences are clipped.
    """
    seq_adv = row_mean(advantages, mask)[:, None].expand_as(advantages)  # [N, T]
    return gspo_token_loss(logp, logp_old, seq_adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)


@LOSSES.register("gmpo")
@per_sequence
def gmpo_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, dual_clip_c=None, pg_cap=None):
    """GMPO: geometric mean of token ratios, clipped in log space; one loss per response.

    ``d~ = sgn(A) min(sgn(A) d, sgn(A) clamp(d, -eps_low, eps_high))``;
    ``rho_i = exp(sum_t m d~ / |o_i|)``; ``L_i = -A_i rho_i`` with ``A_i`` the row's masked mean.
    Zhao et al. 2025, Geometric-Mean Policy Optimization (arXiv:2507.20673), eq. 5.
    """
    log_ratio = logp - logp_old  # [N, T]
    sign = torch.sign(advantages)
    clipped_log = sign * torch.minimum(sign * log_ratio, sign * log_ratio.clamp(-eps_low, eps_high))
    seq_adv = row_mean(advantages, mask)  # [N]
    rho = torch.exp(row_mean(clipped_log, mask))  # [N]
    stats = _clip_fracs(log_ratio.detach(), advantages, mask, -eps_low, eps_high)
    return -seq_adv * rho, stats


@LOSSES.register("cispo")
def cispo_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, dual_clip_c=None, pg_cap=None):
    """CISPO: REINFORCE weighted by a clipped, detached importance ratio.

    ``L = -sg[clip(r, 1-eps_low, 1+eps_high)] A logp``: the gradient is never zeroed.
    MiniMax-M1 (arXiv:2506.13585), eq. 4-5.
    """
    ratio = torch.exp(logp - logp_old).detach()  # [N, T]
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = -weight * advantages * logp
    return loss, _clip_fracs(ratio, advantages, mask, 1.0 - eps_low, 1.0 + eps_high)


@LOSSES.register("tis_pg")
def tis_pg_loss(logp, logp_old, advantages, mask, *, eps_low=None, eps_high=None, dual_clip_c=None, pg_cap):
    """Truncated-IS policy gradient: ``L = -sg[min(r, C)] A logp``, ``C = pg_cap``.

    Upper truncation only (truncated importance sampling, Espeholt et al. 2018, IMPALA,
    arXiv:1802.01561, eq. 1 with rho-bar = C). ``clip_frac_high`` counts truncated tokens
    of either advantage sign; ``clip_frac_low`` is 0 (there is no lower bound).
    """
    ratio = torch.exp(logp - logp_old).detach()  # [N, T]
    loss = -ratio.clamp(max=pg_cap) * advantages * logp
    with torch.no_grad():
        active = mask > 0
        stats = {"clip_frac_low": fraction(torch.zeros_like(active), active), "clip_frac_high": fraction(active & (ratio > pg_cap), active)}
    return loss, stats


@LOSSES.register("reinforce")
def reinforce_loss(logp, logp_old, advantages, mask, *, eps_low=None, eps_high=None, dual_clip_c=None, pg_cap=None):
    """Plain policy gradient ``L = -A logp`` (strictly on-policy; nothing is clipped).

    Williams 1992, REINFORCE.
    """
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return -advantages * logp, {"clip_frac_low": zero, "clip_frac_high": zero}
