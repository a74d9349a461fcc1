"""Training-inference mismatch corrections (ALGORITHMS.md section 5).

The rollout engine (``mu``, ``logp_roll``) and the learner (``pi_old``, ``logp_old``)
disagree on probabilities even with the same weights. The correction weight
``w_{i,t} = exp(logp_old - logp_roll)`` (no grad) is decoupled from the PPO ratio; it
multiplies the policy term only, never the KL term.

Registry signature (``CORRECTIONS``)::

    fn(mask, logp_cur, logp_old, logp_roll, advantages, *, cap, low, high, delta)
        -> Correction(weight, keep, stats)

All tensors [N, T], no grad; ``mask`` is bool; ``logp_cur`` is ``sg[logp]`` (or
``logp_old`` when the mask is computed once per mini-batch, see ``core.py``). ``weight``
[N, T] multiplies the policy loss (None: no weight); ``keep`` [N, T] bool is ANDed into the
mask (None: masks nothing); ``stats`` maps a suffix to a 0-dim tensor reported as
``correction/<name>/<suffix>``. ``low``/``high`` may be None (open bound).

Sources: TIS - Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training" (blog); MIS, sequence-level IS and the geometric-mean mask -
Liu et al. 2025, "When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch" (blog); the V3.2 mask - DeepSeek-V3.2 technical report
(2025), "off-policy sequence masking".
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import torch
from torch import Tensor

from grpoplus.algo._util import fraction, row_mean, row_sum
from grpoplus.registry import Registry


class Correction(NamedTuple):
    weight: Tensor | None  # [N, T] multiplies the policy loss
    keep: Tensor | None  # [N, T] bool, ANDed into the loss mask
    stats: dict[str, Tensor]


CorrectionFn = Callable[..., Correction]
CORRECTIONS: Registry[CorrectionFn] = Registry("correction")


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


@CORRECTIONS.register("tis_token")
def tis_token(mask, logp_cur, logp_old, logp_roll, advantages, *, cap, low=None, high=None, delta=None):
    """Token-level truncated IS: multiply by ``min(w_{i,t}, C)``."""
    log_w = log_is_weight(logp_old, logp_roll, mask)
    weight = torch.exp(log_w.clamp(max=math.log(cap)))
    return Correction(weight, None, {"clipped_frac": fraction(mask & (log_w > math.log(cap)), mask)})


@CORRECTIONS.register("tis_seq")
def tis_seq(mask, logp_cur, logp_old, logp_roll, advantages, *, cap, low=None, high=None, delta=None):
    """Sequence-level truncated IS: ``w_i = exp(sum_t m log w_{i,t})``; multiply row i by ``min(w_i, C)``."""
    log_w_seq = row_sum(log_is_weight(logp_old, logp_roll, mask), mask)  # [N]
    weight = torch.exp(log_w_seq.clamp(max=math.log(cap)))[:, None].expand_as(logp_old)
    over = (log_w_seq > math.log(cap))[:, None] & mask
    active_rows = mask.any(dim=-1)
    stats = {
        "clipped_frac": fraction(over, mask),
        "clipped_seq_frac": fraction(active_rows & over.any(dim=-1), active_rows),
    }
    return Correction(weight, None, stats)


@CORRECTIONS.register("mis_token")
def mis_token(mask, logp_cur, logp_old, logp_roll, advantages, *, cap=None, low, high, delta=None):
    """Token-level masked IS: zero ``m_{i,t}`` where ``w_{i,t}`` is outside ``[low, high]``."""
    keep = _inside(log_is_weight(logp_old, logp_roll, mask), low, high)
    return Correction(None, keep, {"masked_frac": fraction(mask & ~keep, mask)})


@CORRECTIONS.register("mis_seq")
def mis_seq(mask, logp_cur, logp_old, logp_roll, advantages, *, cap=None, low, high, delta=None):
    """Sequence-level masked IS: drop response i where ``w_i = prod_t w_{i,t}`` is outside ``[low, high]``."""
    log_w_seq = row_sum(log_is_weight(logp_old, logp_roll, mask), mask)  # [N]
    return _row_mask(mask, _inside(log_w_seq, low, high))


@CORRECTIONS.register("geo_mask")
def geo_mask(mask, logp_cur, logp_old, logp_roll, advantages, *, cap=None, low, high, delta=None):
    """Geometric-mean mask: drop response i where ``g_i = exp(mean_t log w_{i,t})`` is outside ``[low, high]``.

    A per-token criterion: a long and a short response with the same per-token mismatch
    are judged alike (``mis_seq`` is not length-neutral).
    """
    log_g = row_mean(log_is_weight(logp_old, logp_roll, mask), mask)  # [N]
    return _row_mask(mask, _inside(log_g, low, high))


@CORRECTIONS.register("deepseek_v32_mask")
def deepseek_v32_mask(mask, logp_cur, logp_old, logp_roll, advantages, *, cap=None, low=None, high=None, delta):
    """Drop response i when ``A_i < 0`` and ``(1/|o_i|) sum_t m (logp_roll - sg[logp]) > delta``.

    ``A_i`` is the row's masked mean advantage. DeepSeek-V3.2 report, off-policy sequence masking.
    """
    drift = row_mean(torch.where(mask, logp_roll - logp_cur, torch.zeros_like(logp_cur)), mask)  # [N]
    negative = row_mean(advantages, mask) < 0
    return _row_mask(mask, ~(negative & (drift > delta)))
