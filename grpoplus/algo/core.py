"""``policy_loss``: the facade that composes the registered pure functions.

    mask corrections (in order) -> final mask -> LossNorm
    per-token loss x correction weights -> aggregation  (+ beta * aggregated KL)

It never branches on a registered name: a per-response loss says so with its
``per_sequence`` attribute, a correction says what it does by returning a weight, a
keep-mask, or both.

Gradient accumulation: call :func:`prepare_loss` once per optimizer step on the
whole mini-batch, then ``policy_loss(..., mask=final_mask[rows], norm=norm)`` on each
micro-batch: the micro-batch losses then sum to the whole-batch loss (and so do the
gradients), for every aggregation.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from grpoplus.algo._util import masked_max, masked_mean, masked_min, row_mean, work_dtype
from grpoplus.algo.aggregation import AGGREGATIONS, LossNorm, sequence_mean
from grpoplus.algo.config import AlgoConfig
from grpoplus.algo.corrections import CORRECTIONS
from grpoplus.algo.filters import high_entropy_mask, overlong_filter_mask
from grpoplus.algo.kl import KL_ESTIMATORS
from grpoplus.algo.losses import LOSSES


def _token_advantages(advantages: Tensor, shape: torch.Size) -> Tensor:
    """[N] -> [N, T] broadcast, or [N, T] as is."""
    if advantages.dim() == 1 and advantages.shape[0] == shape[0]:
        return advantages[:, None].expand(shape)
    if advantages.shape == shape:
        return advantages
    raise ValueError(f"advantages must have shape [N]={shape[0]} or [N, T]={tuple(shape)}, got {tuple(advantages.shape)}")


def _check_like(name: str, x: Tensor | None, shape: torch.Size) -> None:
    if x is not None and x.shape != shape:
        raise ValueError(f"{name} must have the shape of mask {tuple(shape)}, got {tuple(x.shape)}")


def _clean(x: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Cast to the work dtype and zero padded positions, so garbage there cannot make NaN."""
    x = x.to(dtype)
    return torch.where(mask, x, torch.zeros((), dtype=dtype, device=x.device))


def apply_mask_corrections(
    names: Sequence[str], mask: Tensor, logp_cur, logp_old, logp_roll, advantages, kwargs: dict
) -> tuple[Tensor, dict[str, Tensor]]:
    """Run the corrections in order; AND every returned keep-mask into ``mask`` [N, T] bool."""
    stats: dict[str, Tensor] = {}
    for name in names:
        out = CORRECTIONS.get(name)(mask, logp_cur, logp_old, logp_roll, advantages, **kwargs)
        if out.keep is not None:
            mask = mask & out.keep
            stats.update({f"correction/{name}/{k}": v for k, v in out.stats.items()})
    return mask, stats


def correction_weights(
    names: Sequence[str], mask: Tensor, logp_cur, logp_old, logp_roll, advantages, kwargs: dict
) -> tuple[Tensor | None, dict[str, Tensor]]:
    """Product of the corrections' weights [N, T] on the final mask (None when no correction weighs)."""
    weight, stats = None, {}
    for name in names:
        out = CORRECTIONS.get(name)(mask, logp_cur, logp_old, logp_roll, advantages, **kwargs)
        if out.weight is not None:
            weight = out.weight if weight is None else weight * out.weight
            stats.update({f"correction/{name}/{k}": v for k, v in out.stats.items()})
    return weight, stats


def mismatch_metrics(logp_old: Tensor, logp_roll: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Rollout-vs-learner mismatch on the unmasked tokens (ALGORITHMS.md section 5).

    ``k1``/``k3`` estimate ``KL(mu || pi_old)`` with samples from ``mu``:
    ``l = logp_roll - logp_old``, ``k3 = exp(-l) - 1 + l``; ``is_weight`` is ``w = exp(-l)``.
    """
    old, roll = logp_old.double(), logp_roll.double()
    log_ratio = torch.where(mask, roll - old, torch.zeros_like(old))
    p_diff = (old.exp() - roll.exp()).abs()
    weight = torch.exp(-log_ratio)
    return {
        "mismatch/abs_p_diff_mean": masked_mean(p_diff, mask),
        "mismatch/abs_p_diff_max": masked_max(p_diff, mask),
        "mismatch/k1": masked_mean(log_ratio, mask),
        "mismatch/k3": masked_mean(weight - 1 + log_ratio, mask),
        "mismatch/is_weight_min": masked_min(weight, mask),
        "mismatch/is_weight_mean": masked_mean(weight, mask),
        "mismatch/is_weight_max": masked_max(weight, mask),
    }


def prepare_loss(
    mask: Tensor,
    logp_old: Tensor | None,
    logp_roll: Tensor | None,
    advantages: Tensor,
    cfg: AlgoConfig,
    *,
    finished: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, LossNorm]:
    """The normalisation hook: call ONCE per optimizer step on the whole mini-batch.

    Applies, in this order, the overlong filter (when ``cfg.overlong_filter`` and
    ``finished`` [N] is given), the high-entropy mask (when ``cfg.entropy_mask_rho < 1``
    and ``entropy`` [N, T] is given) and every masking correction of ``cfg.corrections``.
    ``deepseek_v32_mask`` uses ``logp_old`` in place of ``sg[logp]``: at the start of a
    mini-batch they are equal. ``logp_old`` may be None only when no correction is on (pi_old
    then comes from the training forward). Returns the final bool mask [N, T] and the global
    :class:`LossNorm` (call ``norm.all_reduce()`` under data parallelism). All inputs are
    no-grad; ``advantages`` is [N] or [N, T].
    """
    mask = mask.bool()
    if cfg.overlong_filter and finished is not None:
        mask = overlong_filter_mask(mask, finished)
    if cfg.entropy_mask_rho < 1.0 and entropy is not None:
        mask = high_entropy_mask(entropy, mask, cfg.entropy_mask_rho)
    metrics: dict[str, Tensor] = {}
    if cfg.corrections:
        roll = _require_roll(logp_roll, cfg)
        if logp_old is None:
            raise ValueError(f"corrections {list(cfg.corrections)} need logp_old before the update: "
                             "recompute it (learner.logp_old=recompute)")
        dtype = work_dtype(logp_old)
        old = _clean(logp_old.detach(), mask, dtype)
        adv = _token_advantages(advantages.detach(), mask.shape).to(dtype)
        mask, metrics = apply_mask_corrections(
            cfg.corrections, mask, old, old, _clean(roll.detach(), mask, dtype), adv, cfg.correction_kwargs()
        )
    norm = LossNorm.from_mask(mask, cfg.max_len)
    norm.metrics = {k: float(v) for k, v in metrics.items()}
    return mask, norm


def _require_roll(logp_roll: Tensor | None, cfg: AlgoConfig) -> Tensor:
    if logp_roll is None:
        raise ValueError(f"corrections {list(cfg.corrections)} need logp_roll (the rollout engine's log-probs)")
    return logp_roll


def _kl_term(logp, logp_old, logp_ref, mask, m, norm, cfg) -> tuple[Tensor, dict[str, Tensor]]:
    """``beta * agg(k)`` for placement in_loss (0 otherwise) and the ``loss/kl_ref`` metric."""
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    if cfg.kl_placement != "in_loss" or cfg.beta == 0:
        if logp_ref is None:
            return zero, {}
        k1 = (logp.detach() - logp_ref) * m
        return zero, {"loss/kl_ref": masked_mean(k1, mask)}
    if logp_ref is None:
        raise ValueError(f"beta={cfg.beta} with kl_placement='in_loss' needs logp_ref (or set beta=0)")
    k = KL_ESTIMATORS.get(cfg.kl_estimator)(logp, logp_ref, logp_old)  # [N, T]
    k = torch.where(mask, k, torch.zeros_like(k))
    kl = AGGREGATIONS.get(cfg.aggregation)(k, m, norm)
    return cfg.beta * kl, {"loss/kl_ref": masked_mean(k.detach(), mask)}


def policy_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: AlgoConfig,
    logp_roll: Tensor | None = None,
    logp_ref: Tensor | None = None,
    *,
    norm: LossNorm | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The policy loss of ``cfg`` and its metrics (ALGORITHMS.md sections 2-5).

    logp [N, T] (with grad); logp_old, logp_roll, logp_ref, mask [N, T] (no grad);
    advantages [N] or [N, T]. Any float dtype; the loss is computed in at least float32.

    ``norm=None``: the batch is one micro-batch; the masking corrections run here (the
    v32 mask with ``sg[logp]``) and the denominators come from the resulting mask.
    ``norm`` given: ``mask`` must be the final mask from :func:`prepare_loss`
    (masks are not applied again) and the denominators are the global ones in ``norm``.
    Returns ``(loss, metrics)``; metrics are floats with the keys listed in README.md, section The algorithm core.
    """
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape [N, T], got {tuple(logp.shape)}")
    for name, x in (("mask", mask), ("logp_old", logp_old), ("logp_roll", logp_roll), ("logp_ref", logp_ref)):
        _check_like(name, x, logp.shape)
    mask_b, dtype = mask.bool(), work_dtype(logp)
    adv = _token_advantages(advantages, logp.shape).detach().to(dtype)
    adv = torch.where(mask_b, adv, torch.zeros((), dtype=dtype, device=adv.device))
    cur = torch.where(mask_b, logp.to(dtype), torch.zeros((), dtype=dtype, device=logp.device))
    old = _clean(logp_old.detach(), mask_b, dtype)
    roll = None if logp_roll is None else _clean(logp_roll.detach(), mask_b, dtype)
    ref = None if logp_ref is None else _clean(logp_ref.detach(), mask_b, dtype)
    stats: dict[str, Tensor] = {}
    with torch.no_grad():
        if roll is not None:
            stats.update(mismatch_metrics(old, roll, mask_b))
        if cfg.corrections:
            _require_roll(roll, cfg)
        if norm is None:
            mask_b, mask_stats = apply_mask_corrections(
                cfg.corrections, mask_b, cur.detach(), old, roll, adv, cfg.correction_kwargs()
            )
            stats.update(mask_stats)
            norm = LossNorm.from_mask(mask_b, cfg.max_len)
        else:
            stats.update({k: torch.tensor(v, dtype=torch.float64) for k, v in norm.metrics.items()})
        weight, weight_stats = correction_weights(cfg.corrections, mask_b, cur.detach(), old, roll, adv, cfg.correction_kwargs())
        stats.update(weight_stats)
    m = mask_b.to(dtype)
    pg = _policy_term(cur, old, adv, mask_b, m, weight, norm, cfg, stats)
    kl, kl_stats = _kl_term(cur, old, ref, mask_b, m, norm, cfg)
    total = pg + kl
    with torch.no_grad():
        stats.update(kl_stats)
        stats.update(_ratio_metrics(cur, old, mask_b))
        stats.update({"loss/policy": pg.detach(), "loss/total": total.detach()})
    keys = list(stats)
    values = torch.stack([stats[k].detach().double().cpu().reshape(()) for k in keys]).tolist()
    return total, dict(zip(keys, values))


def _policy_term(cur, old, adv, mask_b, m, weight, norm, cfg, stats) -> Tensor:
    """Registered loss x correction weights, aggregated; adds the loss's stats as ``loss/*``."""
    loss_fn = LOSSES.get(cfg.loss)
    loss, loss_stats = loss_fn(cur, old, adv, m, **cfg.loss_kwargs())
    stats.update({f"loss/{k}": v for k, v in loss_stats.items()})
    if getattr(loss_fn, "per_sequence", False):
        if weight is not None:  # per-response loss: geometric mean of the token weights (section 5)
            weight = torch.exp(row_mean(torch.log(weight.clamp(min=1e-30)), m))  # [N]
            loss = loss * weight
        return sequence_mean(loss, m, norm)
    if weight is not None:
        loss = loss * weight
    loss = torch.where(mask_b, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    return AGGREGATIONS.get(cfg.aggregation)(loss, m, norm)


def _ratio_metrics(cur: Tensor, old: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Ratio statistics and ``approx_kl`` = k3 of pi_old vs pi_theta (Schulman 2020), token means."""
    log_ratio = (cur.detach() - old).double()
    ratio = log_ratio.exp()
    active = mask.sum()
    return {
        "loss/ratio_mean": masked_mean(ratio, mask),
        "loss/ratio_max": masked_max(ratio, mask),
        "loss/approx_kl": masked_mean(ratio - 1 - log_ratio, mask),
        "loss/active_tokens": active.double(),
        "loss/masked_all": (active == 0).double(),
    }
