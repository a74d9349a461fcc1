"""Training-inference mismatch corrections (ALGORITHMS.md section 5).

The rollout engine (``mu``, ``logp_roll``) and the learner (``pi_old``, ``logp_old``)
disagree on probabilities even with the same weights. The correction weight
``w_{i,t} = exp(logp_old - logp_roll)`` (no grad) is decoupled from the PPO ratio; it
multiplies the policy term only, never the KL term.

Registry signature (``CORRECTIONS``)::

    fn(mask, logp_cur, logp_old, logp_roll, advantages, **params)
        -> Correction(weight, keep, stats)

``params`` are ``AlgoConfig.correction_kwargs()`` (``cap``, ``cap_low``, ``low``, ``high``,
``delta``, ``rs_threshold``, ``rs_sum_threshold``); a correction names the ones it reads and
takes ``**_`` for the rest. :func:`needs` marks parameters that must not be None.

All tensors [N, T], no grad; ``mask`` is bool; ``logp_cur`` is ``sg[logp]`` (or
``logp_old`` when the mask is computed once per mini-batch, see ``core.py``). ``weight``
[N, T] multiplies the policy loss (None: no weight); ``keep`` [N, T] bool is ANDed into the
mask (None: masks nothing); ``stats`` maps a suffix to a 0-dim tensor reported as
``correction/<name>/<suffix>``. ``low``/``high``/``cap_low`` may be None (open bound).

Sources: TIS - Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training" (blog); MIS, sequence-level IS and the geometric-mean mask -
Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch" (blog); the V3.2 mask - DeepSeek-V3.2 technical report
(2025), "off-policy sequence masking"; the lower TIS bound - TRL
``vllm_importance_sampling_clip_min``; the k2/k3 rejection masks - verl ``rollout_rs``
(``token_k2/k3``, ``seq_sum/mean/max_k2/k3``).
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from grpoplus.algo._util import fraction, row_mean, row_sum
from grpoplus.algo.registries import CORRECTIONS


class Correction(NamedTuple):
    weight: Tensor | None  # [N, T] multiplies the policy loss
    keep: Tensor | None  # [N, T] bool, ANDed into the loss mask
    stats: dict[str, Tensor]


CorrectionFn = Callable[..., Correction]

# verl's safety bound on the log-ratio inside the k2/k3 rejection statistics.
_RS_LOG_BOUND = 20.0


def needs(*params: str) -> Callable[[CorrectionFn], CorrectionFn]:
    """Mark the parameters a correction cannot run without (``AlgoConfig`` checks them)."""

    def mark(fn: CorrectionFn) -> CorrectionFn:
        fn.needs = params
        return fn

    return mark


def log_is_weight(logp_old: Tensor, logp_roll: Tensor, mask: Tensor) -> Tensor:
    """``log w_{i,t} = logp_old - logp_roll`` on unmasked tokens, 0 elsewhere.  [N, T]."""
    return torch.where(mask, logp_old - logp_roll, torch.zeros_like(logp_old))


def _inside(log_x: Tensor, low: float | None, high: float | None) -> Tensor:
    """``low <= exp(log_x) <= high`` compared in log space (no overflow); None = open bound."""
    ok = torch.ones_like(log_x, dtype=torch.bool)
    if low is not None:
        ok &= log_x >= (math.log(low) if low > 0 else -math.inf)
    if high is not None:
        ok &= log_x <= math.log(high)
    return ok


def _row_mask(mask: Tensor, row_ok: Tensor) -> Correction:
    """Drop whole responses where ``row_ok`` [N] is False; report token and response fractions."""
    keep = row_ok[:, None].expand_as(mask)
    active_rows = mask.any(dim=-1)
    stats = {
        "masked_frac": fraction(mask & ~keep, mask),
        "masked_seq_frac": fraction(active_rows & ~row_ok, active_rows),
    }
    return Correction(None, keep, stats)


def _truncate(log_w: Tensor, cap: float, cap_low: float | None) -> Tensor:
    """``clamp(w, C_low, C)`` computed in log space; ``cap_low`` None = no lower bound."""
    return torch.exp(log_w.clamp(min=_log_low(cap_low), max=math.log(cap)))


def _log_low(cap_low: float | None) -> float:
    return -math.inf if cap_low is None else math.log(cap_low)


@CORRECTIONS.register("tis_token")
def tis_token(mask, logp_cur, logp_old, logp_roll, advantages, *, cap, cap_low=None, **_):
    """Token-level truncated IS: multiply by ``clamp(w_{i,t}, C_low, C)`` (``C_low`` None: ``min(w, C)``)."""
    log_w = log_is_weight(logp_old, logp_roll, mask)
    stats = {
        "clipped_frac": fraction(mask & (log_w > math.log(cap)), mask),
        "clipped_low_frac": fraction(mask & (log_w < _log_low(cap_low)), mask),
    }
    return Correction(_truncate(log_w, cap, cap_low), None, stats)


@CORRECTIONS.register("tis_seq")
def tis_seq(mask, logp_cur, logp_old, logp_roll, advantages, *, cap, cap_low=None, **_):
    """Sequence-level truncated IS: ``w_i = exp(sum_t m log w_{i,t})``; multiply row i by ``clamp(w_i, C_low, C)``."""
    log_w_seq = row_sum(log_is_weight(logp_old, logp_roll, mask), mask)  # [N]
    weight = _truncate(log_w_seq, cap, cap_low)[:, None].expand_as(logp_old)
    over = (log_w_seq > math.log(cap))[:, None] & mask
    under = (log_w_seq < _log_low(cap_low))[:, None] & mask
    active_rows = mask.any(dim=-1)
    stats = {
        "clipped_frac": fraction(over, mask),
        "clipped_seq_frac": fraction(active_rows & over.any(dim=-1), active_rows),
        "clipped_low_frac": fraction(under, mask),
    }
    return Correction(weight, None, stats)


@CORRECTIONS.register("mis_token")
def mis_token(mask, logp_cur, logp_old, logp_roll, advantages, *, low, high, **_):
    """Token-level masked IS: zero ``m_{i,t}`` where ``w_{i,t}`` is outside ``[low, high]``."""
    keep = _inside(log_is_weight(logp_old, logp_roll, mask), low, high)
    return Correction(None, keep, {"masked_frac": fraction(mask & ~keep, mask)})


@CORRECTIONS.register("mis_seq")
def mis_seq(mask, logp_cur, logp_old, logp_roll, advantages, *, low, high, **_):
    """Sequence-level masked IS: drop response i where ``w_i = prod_t w_{i,t}`` is outside ``[low, high]``."""
    log_w_seq = row_sum(log_is_weight(logp_old, logp_roll, mask), mask)  # [N]
    return _row_mask(mask, _inside(log_w_seq, low, high))


@CORRECTIONS.register("geo_mask")
def geo_mask(mask, logp_cur, logp_old, logp_roll, advantages, *, low, high, **_):
    """Geometric-mean mask: drop response i where ``g_i = exp(mean_t log w_{i,t})`` is outside ``[low, high]``.

    A per-token criterion: a long and a short response with the same per-token mismatch
    are judged alike (``mis_seq`` is not length-neutral).
    """
    log_g = row_mean(log_is_weight(logp_old, logp_roll, mask), mask)  # [N]
    return _row_mask(mask, _inside(log_g, low, high))


@CORRECTIONS.register("deepseek_v32_mask")
def deepseek_v32_mask(mask, logp_cur, logp_old, logp_roll, advantages, *, delta, **_):
    """Drop response i when ``A_i < 0`` and ``(1/|o_i|) sum_t m (logp_roll - sg[logp]) > delta``.

    ``A_i`` is the row's masked mean advantage. DeepSeek-V3.2 report, off-policy sequence masking.
    """
    drift = row_mean(torch.where(mask, logp_roll - logp_cur, torch.zeros_like(logp_cur)), mask)  # [N]
    negative = row_mean(advantages, mask) < 0
    return _row_mask(mask, ~(negative & (drift > delta)))


# -- k2/k3 rejection masks (verl rollout_rs) -----------------------------------------------------

def _rs_divergences(logp_old: Tensor, logp_roll: Tensor, mask: Tensor) -> dict[str, Tensor]:
    """Per-token ``k2 = (log w)^2 / 2`` and ``k3 = w - 1 - log w`` (``w = pi_old / mu``, log w clamped
    to +-20 as verl): estimators of ``KL(mu || pi_old)`` from samples of ``mu``. 0 on masked tokens.  [N, T]."""
    log_w = log_is_weight(logp_old, logp_roll, mask).clamp(-_RS_LOG_BOUND, _RS_LOG_BOUND)
    return {"k2": 0.5 * log_w**2, "k3": torch.exp(log_w) - 1.0 - log_w}


def _seq_max(x: Tensor, mask: Tensor) -> Tensor:
    """Max over the unmasked tokens of each row, 0 for an empty row.  [N, T] -> [N]."""
    return torch.where(mask, x, torch.full_like(x, -math.inf)).amax(dim=-1).clamp(min=0.0)


_RS_REDUCE = {"sum": row_sum, "mean": row_mean, "max": _seq_max}


def _register_rs_token(k: str) -> None:
    @CORRECTIONS.register(f"rs_token_{k}")
    def rs_token(mask, logp_cur, logp_old, logp_roll, advantages, *, rs_threshold, **_):
        keep = _rs_divergences(logp_old, logp_roll, mask)[k] <= rs_threshold
        return Correction(None, keep, {"masked_frac": fraction(mask & ~keep, mask)})

    rs_token.__doc__ = f"Token-level rejection: zero ``m_{{i,t}}`` where the token's {k} exceeds ``rs_threshold``."


def _register_rs_seq(reduce: str, k: str) -> None:
    threshold = "rs_sum_threshold" if reduce == "sum" else "rs_threshold"

    @CORRECTIONS.register(f"rs_seq_{reduce}_{k}")
    @needs(threshold)
    def rs_seq(mask, logp_cur, logp_old, logp_roll, advantages, **params):
        stat = _RS_REDUCE[reduce](_rs_divergences(logp_old, logp_roll, mask)[k], mask)  # [N]
        return _row_mask(mask, stat <= params[threshold])

    rs_seq.__doc__ = f"Sequence-level rejection: drop response i where the {reduce} of its tokens' {k} exceeds ``{threshold}``."


for _k in ("k2", "k3"):
    _register_rs_token(_k)
    for _reduce in _RS_REDUCE:
        _register_rs_seq(_reduce, _k)
del _k, _reduce
