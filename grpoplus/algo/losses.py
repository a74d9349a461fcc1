"""Per-token policy losses (ALGORITHMS.md sections 2 and 10), minimised.

Registry signature (``LOSSES``)::

    fn(logp, logp_old, advantages, mask, **params) -> (loss, stats)

``params`` are ``AlgoConfig.loss_kwargs()`` (``eps_low``, ``eps_high``, ``dual_clip_c``,
``pg_cap``, ``tau_pos``, ``tau_neg``, ``cov_ratio``, ``cov_lb``, ``cov_ub``,
``kl_cov_coef``); a loss names the ones it reads and takes ``**_`` for the rest.

``logp`` [N, T] carries the gradient; ``logp_old``, ``advantages`` [N, T] and ``mask``
[N, T] (float 0/1) do not. ``loss`` is [N, T] per token, or [N] per response when the
function is marked with :func:`per_sequence` (it is then averaged over the responses that
keep a token). ``stats`` maps a metric name to a 0-dim tensor; the facade reports it as
``loss/<name>``. Every built-in loss reports ``clip_frac_low`` (``A<0`` and ratio below
the trust region) and ``clip_frac_high`` (``A>0`` and ratio above it). A loss never
normalises itself: aggregation is separate (``aggregation.py``).

Markers read by the facade and the config (never a branch on a name):
:func:`per_sequence`; :func:`ratio_dependent` (the parameters that only act once the policy
has moved from ``pi_old``, listed by ``AlgoConfig.inert_switches``); :func:`selects_tokens`
(the loss needs a batch-level token selection, passed as ``selected`` [N, T] bool).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from grpoplus.algo._util import fraction, masked_mean, row_mean, row_sum
from grpoplus.algo.covariance import clip_cov_select, kl_cov_select
from grpoplus.algo.registries import LOSSES

LossFn = Callable[..., tuple[Tensor, dict[str, Tensor]]]

# Log-ratios are clamped here before exp() in the losses that follow verl's definition
# (SAPO, DPPO): exp(20) ~ 4.9e8 stays finite in every float dtype.
_LOG_RATIO_BOUND = 20.0


def per_sequence(fn: LossFn) -> LossFn:
    """Mark a loss as producing one value per response ([N]) instead of per token."""
    fn.per_sequence = True
    return fn


def ratio_dependent(*params: str) -> Callable[[LossFn], LossFn]:
    """Mark the config parameters that act only through ``r != 1`` (inert with one update per batch)."""

    def mark(fn: LossFn) -> LossFn:
        fn.ratio_params = params
        return fn

    return mark


def selects_tokens(selector: Callable[..., Tensor]) -> Callable[[LossFn], LossFn]:
    """Mark a loss that needs ``selected`` [N, T] bool from ``selector`` (see ``covariance.py``),
    computed once over the optimizer step's whole batch."""

    def mark(fn: LossFn) -> LossFn:
        fn.token_selector = selector
        return fn

    return mark


def _clip_fracs(ratio: Tensor, adv: Tensor, mask: Tensor, low: float, high: float) -> dict[str, Tensor]:
    """Token fractions clipped at the low side (A<0, ratio<low) and high side (A>0, ratio>high)."""
    with torch.no_grad():
        active = mask > 0
        return {
            "clip_frac_low": fraction(active & (adv < 0) & (ratio < low), active),
            "clip_frac_high": fraction(active & (adv > 0) & (ratio > high), active),
        }


def _no_clip(mask: Tensor) -> dict[str, Tensor]:
    zero = torch.zeros((), dtype=torch.float32, device=mask.device)
    return {"clip_frac_low": zero, "clip_frac_high": zero}


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
@ratio_dependent("eps_low", "eps_high", "dual_clip_c")
def clip_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, dual_clip_c=None, **_):
    """PPO/GRPO clipped surrogate; clip-higher when ``eps_high > eps_low``.

    ``L = -min(r A, clip(r, 1-eps_low, 1+eps_high) A)``, ``r = exp(logp - logp_old)``.
    DeepSeekMath (arXiv:2402.03300) eq. 3; clip-higher: DAPO (arXiv:2503.14476) sec. 3.1.
    """
    ratio = torch.exp(logp - logp_old)  # [N, T]
    loss = _clipped_objective(ratio, advantages, eps_low, eps_high, dual_clip_c)
    return loss, _clip_fracs(ratio.detach(), advantages, mask, 1.0 - eps_low, 1.0 + eps_high)


@LOSSES.register("gspo_token")
@ratio_dependent("eps_low", "eps_high", "dual_clip_c")
def gspo_token_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, dual_clip_c=None, **_):
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
@ratio_dependent("eps_low", "eps_high", "dual_clip_c")
def gspo_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, dual_clip_c=None, **_):
    """GSPO with one advantage per response: the row's masked mean of ``advantages``.

    With a constant ``A_i`` over the tokens, GSPO-token equals sequence-level GSPO in value
    and gradient (GSPO, arXiv:2507.18071, sec. 4.3), so whole sequences are clipped.
    """
    seq_adv = row_mean(advantages, mask)[:, None].expand_as(advantages)  # [N, T]
    return gspo_token_loss(logp, logp_old, seq_adv, mask, eps_low=eps_low, eps_high=eps_high, dual_clip_c=dual_clip_c)


@LOSSES.register("gmpo")
@per_sequence
@ratio_dependent("eps_low", "eps_high")
def gmpo_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, **_):
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
@ratio_dependent("eps_low", "eps_high")
def cispo_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, **_):
    """CISPO: REINFORCE weighted by a clipped, detached importance ratio.

    ``L = -sg[clip(r, 1-eps_low, 1+eps_high)] A logp``: the gradient is never zeroed.
    MiniMax-M1 (arXiv:2506.13585), eq. 4-5.
    """
    ratio = torch.exp(logp - logp_old).detach()  # [N, T]
    weight = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    loss = -weight * advantages * logp
    return loss, _clip_fracs(ratio, advantages, mask, 1.0 - eps_low, 1.0 + eps_high)


@LOSSES.register("tis_pg")
@ratio_dependent("pg_cap")
def tis_pg_loss(logp, logp_old, advantages, mask, *, pg_cap, **_):
    """Truncated-IS policy gradient: ``L = -sg[min(r, C)] A logp``, ``C = pg_cap``.

    Upper truncation only (truncated importance sampling, Espeholt et al. 2018, IMPALA,
    arXiv:1802.01561, eq. 1 with rho-bar = C). ``clip_frac_high`` counts truncated tokens
    of either advantage sign; ``clip_frac_low`` is 0 (there is no lower bound).
    """
    ratio = torch.exp(logp - logp_old).detach()  # [N, T]
    loss = -ratio.clamp(max=pg_cap) * advantages * logp
    stats = _no_clip(mask)
    stats["clip_frac_high"] = fraction((mask > 0) & (ratio > pg_cap), mask > 0)
    return loss, stats


@LOSSES.register("tis_pg_seq")
@ratio_dependent("pg_cap")
def tis_pg_seq_loss(logp, logp_old, advantages, mask, *, pg_cap, **_):
    """Sequence-level truncated-IS policy gradient: ``L = -sg[min(s_i, C)] A logp`` for every token
    of response i, ``s_i = exp(sum_t m (logp - logp_old))`` (the product of the token ratios).

    verl's bypass mode ``rollout_is="sequence"`` with ``loss_type="reinforce"`` (IS weights from
    the current policy against the sampler: run it with ``learner.logp_old=rollout``). Truncated
    IS: IMPALA (arXiv:1802.01561), eq. 1, with the sequence as the unit of importance.
    ``clip_frac_high``: tokens of truncated responses; ``truncated_seq_frac``: those responses.
    """
    log_seq = row_sum(logp - logp_old, mask).detach()  # [N]
    weight = torch.exp(log_seq.clamp(max=math.log(pg_cap)))[:, None]  # [N, 1]
    loss = -weight * advantages * logp
    with torch.no_grad():
        active, rows = mask > 0, (mask > 0).any(dim=-1)
        over = log_seq > math.log(pg_cap)
        stats = _no_clip(mask)
        stats["clip_frac_high"] = fraction(active & over[:, None], active)
        stats["truncated_seq_frac"] = fraction(rows & over, rows)
    return loss, stats


@LOSSES.register("reinforce")
def reinforce_loss(logp, logp_old, advantages, mask, **_):
    """Plain policy gradient ``L = -A logp`` (strictly on-policy; nothing is clipped).

    Williams 1992, REINFORCE.
    """
    return -advantages * logp, _no_clip(mask)


@LOSSES.register("sapo")
@ratio_dependent("tau_pos", "tau_neg")
def sapo_loss(logp, logp_old, advantages, mask, *, tau_pos, tau_neg, **_):
    """SAPO: a soft sigmoid gate instead of the hard clip.

    ``f(r) = (4/tau) sigmoid(tau (r - 1))``, ``L = -f(r) A``, ``tau = tau_pos`` for ``A > 0``
    and ``tau_neg`` for ``A <= 0``. ``df/dlogp = 4 s (1 - s) r`` with ``s = sigmoid(tau (r - 1))``:
    exactly 1 at ``r = 1`` (the policy gradient), decaying smoothly as ``r`` leaves 1, faster
    for the larger temperature. Soft Adaptive Policy Optimization (arXiv:2511.20347), as
    verl ``sapo`` and TRL ``loss_type="sapo"``; the log-ratio is clamped to +-20 as in verl.
    Nothing is hard-clipped: ``clip_frac_*`` are 0; ``gate_grad_mean`` is the token mean of
    ``4 s (1 - s) r`` (1 on-policy).
    """
    ratio = torch.exp((logp - logp_old).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND))  # [N, T]
    tau = torch.where(advantages > 0, advantages.new_tensor(tau_pos), advantages.new_tensor(tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0))
    loss = -gate * (4.0 / tau) * advantages
    stats = _no_clip(mask)
    with torch.no_grad():
        stats["gate_grad_mean"] = masked_mean(4.0 * gate * (1.0 - gate) * ratio, mask > 0)
    return loss, stats


def _dppo(logp, logp_old, advantages, mask, valid: Tensor, pg_cap: float):
    """``L = -A sg[min(r, C)] logp`` on the tokens inside the trust region, 0 outside (DPPO)."""
    ratio = torch.exp((logp - logp_old).clamp(-_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)).detach()  # [N, T]
    loss = -advantages * ratio.clamp(max=pg_cap) * logp * valid
    with torch.no_grad():
        active = mask > 0
        stats = {
            "clip_frac_low": fraction(active & (advantages < 0) & ~valid, active),
            "clip_frac_high": fraction(active & (advantages > 0) & ~valid, active),
            "truncated_frac": fraction(active & valid & (ratio > pg_cap), active),
        }
    return loss, stats


@LOSSES.register("dppo_tv")
@ratio_dependent("eps_low", "eps_high", "pg_cap")
def dppo_tv_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, pg_cap, **_):
    """DPPO-TV: a binary trust region on the probability change ``p - p_old`` of the sampled token.

    A token is masked (loss and gradient 0, still counted in the denominators) when it left the
    region in the direction its advantage pushes: ``A > 0`` and ``p - p_old > eps_high``, or
    ``A <= 0`` and ``p - p_old < -eps_low``. The others get the truncated-IS policy gradient
    ``-A sg[min(r, C)] logp``, ``C = pg_cap``. DPPO (arXiv:2602.04879), as verl ``dppo_tv``
    (verl's ``clip_ratio_low/high`` are ``eps_low/high`` here, its ``clip_ratio_c`` is ``pg_cap``).
    """
    with torch.no_grad():
        change = torch.exp(logp) - torch.exp(logp_old)  # p - p_old
        valid = torch.where(advantages > 0, change <= eps_high, change >= -eps_low)
    return _dppo(logp, logp_old, advantages, mask, valid, pg_cap)


@LOSSES.register("dppo_kl")
@ratio_dependent("eps_low", "eps_high", "pg_cap")
def dppo_kl_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, pg_cap, **_):
    """DPPO-KL: the trust region on the binary KL ``p_old log(p_old/p) + (1-p_old) log((1-p_old)/(1-p))``
    (``+1e-8`` inside the last log, as verl).

    Masked: ``A > 0``, ``p > p_old`` and ``KL > eps_high``; or ``A <= 0``, ``p < p_old`` and
    ``KL > eps_low``. The others: ``-A sg[min(r, C)] logp``. DPPO (arXiv:2602.04879), as verl ``dppo_kl``.
    """
    with torch.no_grad():
        p, p_old = torch.exp(logp), torch.exp(logp_old)
        binary_kl = p_old * (logp_old - logp) + (1 - p_old) * torch.log((1 - p_old + 1e-8) / (1 - p + 1e-8))
        valid = torch.where(advantages > 0, (binary_kl <= eps_high) | (p <= p_old), (binary_kl <= eps_low) | (p >= p_old))
    return _dppo(logp, logp_old, advantages, mask, valid, pg_cap)


@LOSSES.register("clip_cov")
@ratio_dependent("eps_low", "eps_high", "dual_clip_c")
@selects_tokens(clip_cov_select)
def clip_cov_loss(logp, logp_old, advantages, mask, *, eps_low, eps_high, dual_clip_c=None, selected, **_):
    """Clip-Cov: the PPO clip loss, with the selected high-covariance tokens' loss and gradient
    set to 0 (they still count in the denominators). Selection: :func:`clip_cov_select`.

    Cui et al. 2025, The Entropy Mechanism of RL for Reasoning LMs (arXiv:2505.22617), Clip-Cov;
    as verl ``clip_cov``.
    """
    ratio = torch.exp(logp - logp_old)  # [N, T]
    loss = _clipped_objective(ratio, advantages, eps_low, eps_high, dual_clip_c) * ~selected
    stats = _clip_fracs(ratio.detach(), advantages, mask, 1.0 - eps_low, 1.0 + eps_high)
    stats["cov_selected_frac"] = fraction(selected & (mask > 0), mask > 0)
    return loss, stats


@LOSSES.register("kl_cov")
@ratio_dependent("kl_cov_coef", "cov_ratio")
@selects_tokens(kl_cov_select)
def kl_cov_loss(logp, logp_old, advantages, mask, *, kl_cov_coef, selected, **_):
    """KL-Cov: the unclipped surrogate ``-r A``, plus ``kl_cov_coef |log r|`` on the selected
    top-covariance tokens. Selection: :func:`kl_cov_select`. Nothing is clipped.

    Cui et al. 2025 (arXiv:2505.22617), KL-Cov; as verl ``kl_cov``.
    """
    log_ratio = logp - logp_old  # [N, T]
    loss = -torch.exp(log_ratio) * advantages + kl_cov_coef * log_ratio.abs() * selected
    stats = _no_clip(mask)
    stats["cov_selected_frac"] = fraction(selected & (mask > 0), mask > 0)
    return loss, stats
