"""On-policy distillation (ALGORITHMS.md section 11): a frozen teacher scores the student's own samples.

Two ways the teacher's signal reaches the policy:

- the ``opd`` token advantage, from the teacher's log-prob of each sampled token only
  (:func:`opd_advantages`): ``A_{i,t} = A_i + lambda_opd * (-sg[logp_old - logp_T])``, then any
  policy loss of section 2. It needs one number per token from the teacher, so an endpoint can
  serve it (Thinking Machines' on-policy distillation; prime-rl ``opd``; verl distillation with
  ``use_policy_gradient``).
- a full-vocabulary divergence as a loss term (``DISTILL_LOSSES``): ``reverse_kl`` (GKD's reverse-KL
  case, arXiv:2306.13649) and ``gjsd``, the generalized Jensen-Shannon divergence in TRL's convention
  (``beta = 0``: forward KL(T || S); ``beta = 1``: reverse KL(S || T); in between
  ``beta KL(T || M) + (1 - beta) KL(S || M)`` with ``M = beta p_T + (1 - beta) p_S``). It needs the
  teacher's logits, so the teacher and the student must share a vocabulary and live in one process.

Registry signature (``DISTILL_LOSSES``)::

    fn(student_logits: Tensor[..., V], teacher_logits: Tensor[..., V], *, beta: float) -> Tensor[...]

the per-token divergence (gradient through the student's logits only), aggregated like the policy loss.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

from grpoplus.algo.registries import DISTILL_LOSSES

DistillFn = Callable[..., Tensor]


def opd_token_kl(logp_old: Tensor, logp_teacher: Tensor, mask: Tensor) -> Tensor:
    """[N, T] ``kl_{i,t} = logp_old - logp_T``: the per-token reverse-KL estimate on the student's samples (k1 of
    pi_old against the teacher), 0 where ``mask`` is 0."""
    kl = logp_old.double() - logp_teacher.double()
    return torch.where(mask.bool(), kl, torch.zeros((), dtype=kl.dtype, device=kl.device))


def opd_advantages(advantages: Tensor, logp_old: Tensor, logp_teacher: Tensor, mask: Tensor, lambda_opd: float,
                   outcome: bool = True) -> Tensor:
    """[N, T] token advantages ``A_i + lambda_opd * (-sg[kl_{i,t}])``, not normalised, no discounting.

    ``advantages``: the outcome estimator's [N] (or token-level [N, T]); ``outcome=False`` drops it (pure
    distillation: the teacher's term alone). Zero where ``mask`` is 0. Float64."""
    kl = opd_token_kl(logp_old.detach(), logp_teacher.detach(), mask)
    outcome_part = advantages.detach().double()
    if outcome_part.dim() == 1:
        outcome_part = outcome_part[:, None].expand_as(kl)
    if not outcome:
        outcome_part = torch.zeros_like(kl)
    adv = outcome_part - lambda_opd * kl
    return torch.where(mask.bool(), adv, torch.zeros((), dtype=adv.dtype, device=adv.device))


def opd_metrics(logp_old: Tensor, logp_teacher: Tensor, mask: Tensor, teacher_top1: Tensor | None) -> dict[str, float]:
    """``opd/reverse_kl`` (masked mean of kl_{i,t}), ``opd/teacher_logp`` (mean teacher log-prob of the sampled
    tokens) and ``opd/top1_agreement`` (the fraction of sampled tokens that are the teacher's first choice)."""
    m = mask.bool()
    count = max(int(m.sum()), 1)
    out = {"opd/reverse_kl": float(opd_token_kl(logp_old, logp_teacher, mask).sum()) / count,
           "opd/teacher_logp": float(torch.where(m, logp_teacher.double(), 0.0).sum()) / count}
    if teacher_top1 is not None:
        out["opd/top1_agreement"] = float((teacher_top1.bool() & m).sum()) / count
    return out


def _log_probs(student_logits: Tensor, teacher_logits: Tensor) -> tuple[Tensor, Tensor]:
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"student logits {tuple(student_logits.shape)} and teacher logits "
                         f"{tuple(teacher_logits.shape)} differ: a full-vocabulary distillation loss needs one vocabulary")
    work = torch.promote_types(student_logits.dtype, torch.float32)
    return student_logits.to(work).log_softmax(-1), teacher_logits.detach().to(work).log_softmax(-1)


def _kl(log_p: Tensor, log_q: Tensor) -> Tensor:
    """KL(p || q) over the last dimension."""
    return (log_p.exp() * (log_p - log_q)).sum(-1)


@DISTILL_LOSSES.register("reverse_kl")
def reverse_kl(student_logits: Tensor, teacher_logits: Tensor, **_) -> Tensor:
    """``sum_v pi_theta(v) (log pi_theta(v) - log pi_T(v))`` per position (GKD, arXiv:2306.13649)."""
    log_s, log_t = _log_probs(student_logits, teacher_logits)
    return _kl(log_s, log_t)


@DISTILL_LOSSES.register("gjsd")
def generalized_jsd(student_logits: Tensor, teacher_logits: Tensor, *, beta: float = 0.5, **_) -> Tensor:
    """The generalized Jensen-Shannon divergence per position, TRL's ``beta`` convention (module docstring)."""
    log_s, log_t = _log_probs(student_logits, teacher_logits)
    if beta <= 0.0:
        return _kl(log_t, log_s)
    if beta >= 1.0:
        return _kl(log_s, log_t)
    log_m = torch.logaddexp(log_s + math.log(1.0 - beta), log_t + math.log(beta))
    return beta * _kl(log_t, log_m) + (1.0 - beta) * _kl(log_s, log_m)
