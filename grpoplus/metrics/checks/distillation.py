"""Doctor checks of on-policy distillation runs (ALGORITHMS.md section 11). Registered in
:data:`grpoplus.metrics.checks.CHECKS` on import; silent on runs without a teacher (no ``opd/*`` metric)."""

from __future__ import annotations

from typing import Mapping

from ..series import Trace
from .base import CHECKS, DoctorThresholds, Finding, early_recent


@CHECKS.register("opd_stalled")
def check_opd_stalled(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """The student's reverse KL to the teacher stopped falling while it is still far from the teacher: the
    teacher's signal is too weak (or too noisy, at a learning rate that makes the updates cancel out)."""
    kl = early_recent(trace.get("opd/reverse_kl"), th)
    if kl is None:
        return None
    early, recent = kl
    if recent.mean() < th.opd_kl_floor or recent.mean() <= (1.0 - th.opd_min_drop) * early.mean():
        return None
    agreement = trace.get("opd/top1_agreement").finite()
    shown = f"; opd/top1_agreement {agreement.tail(th.window).mean():.2f}" if len(agreement) else ""
    return Finding(
        "opd_stalled", "warning", "the student stopped moving toward the teacher",
        f"opd/reverse_kl {early.mean():.3g} ({early.span()}) -> {recent.mean():.3g} ({recent.span()}), a drop under "
        f"{th.opd_min_drop:.0%} while above {th.opd_kl_floor}{shown}",
        "a per-token teacher advantage is one noisy sample per token: lower learner.lr if the KL wanders, raise "
        "algo.lambda_opd if the outcome advantage drowns it, or with a local teacher add the full-vocabulary "
        "algo.distill_loss=reverse_kl; check learner.teacher is the model meant")
