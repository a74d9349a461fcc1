"""``policy_loss``: the facade that composes the registered pure functions.

    mask corrections (in order) -> final mask -> LossNorm (+ the loss's token selection)
    per-token loss x correction weights -> aggregation
        (+ beta * aggregated KL) (- c * aggregated entropy)

It never branches on a registered name: a per-response loss says so with its
``per_sequence`` attribute, a loss that needs a batch-level token selection (Clip-Cov,
KL-Cov) with its ``token_selector``, a correction says what it does by returning a
weight, a keep-mask, or both.

Gradient accumulation: call :func:`prepare_loss` once per optimizer step on the
whole mini-batch, then ``policy_loss(..., mask=final_mask[rows], norm=norm.rows(rows))``
on each micro-batch: the micro-batch losses then sum to the whole-batch loss (and so do
the gradients), for every aggregation.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

from grpoplus.algo._util import masked_max, masked_mean, masked_min, row_mean, work_dtype
from grpoplus.algo.aggregation import AGGREGATIONS, LossNorm, sequence_mean
from grpoplus.algo.config import AlgoConfig
from grpoplus.algo.corrections import CORRECTIONS
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

    ``k1``/``k2``/``k3`` estimate ``KL(mu || pi_old)`` with samples from ``mu``:
    ``l = logp_roll - logp_old``, ``k2 = l^2 / 2``, ``k3 = exp(-l) - 1 + l``; ``is_weight`` is ``w = exp(-l)``.
    """
    old, roll = logp_old.double(), logp_roll.double()
    log_ratio = torch.where(mask, roll - old, torch.zeros_like(old))
    p_diff = (old.exp() - roll.exp()).abs()
    weight = torch.exp(-log_ratio)
    return {
        "mismatch/abs_p_diff_mean": masked_mean(p_diff, mask),
        "mismatch/abs_p_diff_max": masked_max(p_diff, mask),
        "mismatch/k1": masked_mean(log_ratio, mask),
        "mismatch/k2": masked_mean(0.5 * log_ratio**2, mask),
        "mismatch/k3": masked_mean(weight - 1 + log_ratio, mask),
        "mismatch/is_weight_min": masked_min(weight, mask),
        "mismatch/is_weight_mean": masked_mean(weight, mask),
        "mismatch/is_weight_max": masked_max(weight, mask),
    }


def needs_token_selection(cfg: AlgoConfig) -> bool:
    """True when ``cfg.loss`` selects tokens once per optimizer step (Clip-Cov, KL-Cov): it needs pi_old first."""
    return getattr(LOSSES.get(cfg.loss), "token_selector", None) is not None


def select_tokens(cfg: AlgoConfig, advantages: Tensor, logp_sel: Tensor, logp_old: Tensor, mask: Tensor,
                  generator: torch.Generator | None) -> Tensor | None:
    """The token selection of ``cfg.loss`` (None when it needs none).  All [N, T], no grad; mask bool."""
    selector = getattr(LOSSES.get(cfg.loss), "token_selector", None)
    if selector is None:
        return None
    return selector(advantages, logp_sel, logp_old, mask, generator=generator, **cfg.loss_kwargs())


def prepare_loss(
    mask: Tensor,
    logp_old: Tensor | None,
    logp_roll: Tensor | None,
    advantages: Tensor,
    cfg: AlgoConfig,
    *,
    generator: torch.Generator | None = None,
    finished: Tensor | None = None,
    entropy: Tensor | None = None,
) -> tuple[Tensor, LossNorm]:
    """The normalisation hook: call ONCE per optimizer step on the whole mini-batch.

    ``finished`` and ``entropy`` are deprecated (since 2026-11-27, see CHANGELOG.md): apply
    :func:`~grpoplus.algo.filters.overlong_filter_mask` and :func:`~grpoplus.algo.filters.high_entropy_mask` to
    ``mask`` first, as the learner's preparation does; given, they are applied here as before, with a
    ``DeprecationWarning``.

    Applies every masking correction of ``cfg.corrections`` to ``mask`` (the loss mask the learner's
    preparation made: overlong filtering and the high-entropy mask are applied there, once per batch);
    then makes the token selection of a loss that needs one (Clip-Cov's random subset draws from
    ``generator``; pass one seeded per optimizer step so a resumed run draws the same).
    ``deepseek_v32_mask`` and the selection use ``logp_old`` in place of ``sg[logp]``: on the
    first update of a batch they are equal. ``logp_old`` may be None only when neither is on
    (pi_old then comes from the training forward). Returns the final bool mask [N, T] and the global
    :class:`LossNorm` of the whole mini-batch (every learner rank computes it on the whole mini-batch; pass a
    micro-batch ``norm.rows(idx)``). All inputs are no-grad; ``advantages`` is [N] or [N, T].
    """
    mask = _deprecated_filters(mask.bool(), cfg, finished, entropy)
    metrics: dict[str, Tensor] = {}
    if logp_old is None:
        if cfg.corrections or needs_token_selection(cfg):
            raise ValueError(f"corrections {list(cfg.corrections)} / loss {cfg.loss!r} need logp_old before the "
                             "update: recompute it (learner.logp_old=recompute)")
        return mask, LossNorm.from_mask(mask, cfg.max_len)
    dtype = work_dtype(logp_old)
    old = _clean(logp_old.detach(), mask, dtype)
    adv = _token_advantages(advantages.detach(), mask.shape).to(dtype)
    if cfg.corrections:
        roll = _require_roll(logp_roll, cfg)
        mask, metrics = apply_mask_corrections(
            cfg.corrections, mask, old, old, _clean(roll.detach(), mask, dtype), adv, cfg.correction_kwargs()
        )
    norm = LossNorm.from_mask(mask, cfg.max_len)
    norm.metrics = {k: float(v) for k, v in metrics.items()}
    norm.selected = select_tokens(cfg, adv, old, old, mask, generator)
    return mask, norm


def _deprecated_filters(mask: Tensor, cfg: AlgoConfig, finished: Tensor | None, entropy: Tensor | None) -> Tensor:
    """The overlong filter and the high-entropy mask as prepare_loss applied them before 2026-11-27."""
    if finished is None and entropy is None:
        return mask
    import warnings

    from grpoplus.algo.filters import high_entropy_mask, overlong_filter_mask

    warnings.warn("prepare_loss(finished=..., entropy=...) is deprecated: apply grpoplus.algo.overlong_filter_mask "
                  "and grpoplus.algo.high_entropy_mask to the mask first (CHANGELOG.md, 2026-11-27)",
                  DeprecationWarning, stacklevel=3)
    if cfg.overlong_filter and finished is not None:
        mask = overlong_filter_mask(mask, finished).bool()
    if cfg.entropy_mask_rho < 1.0 and entropy is not None:
        mask = high_entropy_mask(entropy, mask, cfg.entropy_mask_rho).bool()
    return mask


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
    entropy: Tensor | None = None,
    entropy_coef: float | None = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The policy loss of ``cfg`` and its metrics (ALGORITHMS.md sections 2-5 and 10).

    logp [N, T] (with grad); logp_old, logp_roll, logp_ref, mask [N, T] (no grad);
    advantages [N] or [N, T]. Any float dtype; the loss is computed in at least float32.

    ``norm=None``: the batch is one micro-batch; the masking corrections and the loss's token
    selection run here (with ``sg[logp]``; Clip-Cov draws from ``generator``) and the
    denominators come from the resulting mask. ``norm`` given: ``mask`` must be the final mask
    from :func:`prepare_loss` (masks are not applied again), ``norm`` its ``norm.rows(idx)`` for
    the micro-batch, and the denominators are the global ones in ``norm``.
    ``entropy`` [N, T] (with grad): the token entropy; the bonus ``-c * agg(H)`` is added, with
    the policy term's aggregation and denominators and ``c = entropy_coef`` (default
    ``cfg.entropy_coef``; required with ``cfg.entropy_adaptive``, from :class:`EntropyControl`).
    Returns ``(loss, metrics)``; metrics are floats with the keys listed in docs/concepts/algorithm-core.md.
    """
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape [N, T], got {tuple(logp.shape)}")
    for name, x in (("mask", mask), ("logp_old", logp_old), ("logp_roll", logp_roll), ("logp_ref", logp_ref),
                    ("entropy", entropy)):
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
        mask_b, norm, weight = _masks_weights_norm(cur.detach(), old, roll, adv, mask_b, norm, cfg, generator, stats)
    m = mask_b.to(dtype)
    pg = _policy_term(cur, old, adv, mask_b, m, weight, norm, cfg, stats)
    kl, kl_stats = _kl_term(cur, old, ref, mask_b, m, norm, cfg)
    bonus, entropy_stats = _entropy_term(entropy, mask_b, m, norm, cfg, entropy_coef)
    total = pg + kl + bonus
    with torch.no_grad():
        stats.update(kl_stats)
        stats.update(entropy_stats)
        stats.update(_ratio_metrics(cur, old, mask_b))
        stats.update({"loss/policy": pg.detach(), "loss/total": total.detach()})
    keys = list(stats)
    values = torch.stack([stats[k].detach().double().cpu().reshape(()) for k in keys]).tolist()
    return total, dict(zip(keys, values))


def _masks_weights_norm(cur, old, roll, adv, mask_b, norm, cfg, generator, stats):
    """Mismatch metrics; the final mask, norm and token selection (here, or checked from ``norm``);
    the correction weights. Returns ``(mask, norm, weight)`` and fills ``stats``."""
    if roll is not None:
        stats.update(mismatch_metrics(old, roll, mask_b))
    if cfg.corrections:
        _require_roll(roll, cfg)
    if norm is None:
        mask_b, mask_stats = apply_mask_corrections(cfg.corrections, mask_b, cur, old, roll, adv, cfg.correction_kwargs())
        stats.update(mask_stats)
        norm = LossNorm.from_mask(mask_b, cfg.max_len)
        norm.selected = select_tokens(cfg, adv, cur, old, mask_b, generator)
    else:
        stats.update({k: torch.tensor(v, dtype=torch.float64) for k, v in norm.metrics.items()})
        _check_selection(norm, cfg, mask_b.shape)
    weight, weight_stats = correction_weights(cfg.corrections, mask_b, cur, old, roll, adv, cfg.correction_kwargs())
    stats.update(weight_stats)
    return mask_b, norm, weight


def _check_selection(norm: LossNorm, cfg: AlgoConfig, shape: torch.Size) -> None:
    if getattr(LOSSES.get(cfg.loss), "token_selector", None) is None:
        return
    if norm.selected is None:
        raise ValueError(f"loss={cfg.loss!r} selects tokens once per optimizer step: build norm with prepare_loss")
    if norm.selected.shape != shape:
        raise ValueError(f"norm.selected covers {tuple(norm.selected.shape)} but the micro-batch is {tuple(shape)}: "
                         "pass norm.rows(idx) with the micro-batch's row indices")


def _policy_term(cur, old, adv, mask_b, m, weight, norm, cfg, stats) -> Tensor:
    """Registered loss x correction weights, aggregated; adds the loss's stats as ``loss/*``."""
    loss_fn = LOSSES.get(cfg.loss)
    kwargs = cfg.loss_kwargs()
    if norm.selected is not None:
        kwargs["selected"] = norm.selected.to(mask_b.device) & mask_b
    loss, loss_stats = loss_fn(cur, old, adv, m, **kwargs)
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


def _entropy_term(entropy, mask_b, m, norm, cfg, coef) -> tuple[Tensor, dict[str, Tensor]]:
    """``-c * agg(H)`` with the policy term's aggregation and norm (not weighted by corrections);
    metrics ``loss/entropy`` (token mean of H), ``loss/entropy_coef``, ``loss/entropy_bonus``."""
    zero = torch.zeros((), dtype=m.dtype, device=m.device)
    if entropy is None:
        if cfg.entropy_bonus:
            raise ValueError(f"entropy_coef={cfg.entropy_coef} / entropy_adaptive={cfg.entropy_adaptive} need "
                             "entropy= the token entropy [N, T] with its gradient")
        return zero, {}
    if coef is None:
        if cfg.entropy_adaptive:
            raise ValueError("entropy_adaptive=True needs entropy_coef= EntropyControl.applied_coef")
        coef = cfg.entropy_coef
    h = torch.where(mask_b, entropy.to(m.dtype), zero)
    bonus = -coef * AGGREGATIONS.get(cfg.aggregation)(h, m, norm) if coef != 0 else zero
    return bonus, {
        "loss/entropy": masked_mean(h.detach(), mask_b),
        "loss/entropy_coef": torch.tensor(float(coef), dtype=torch.float64),
        "loss/entropy_bonus": bonus.detach(),
    }


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
