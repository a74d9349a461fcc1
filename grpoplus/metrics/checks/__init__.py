"""The run doctor's checks, each a registered function ``check(trace, thresholds, batch_info) -> Finding | None`` in
:data:`CHECKS`; importing this package registers the built-in ones (single-turn training, off-policy training,
multi-turn environments, distillation, the certain-failure signals). :mod:`grpoplus.metrics.doctor` runs them."""

from . import certain, distillation, environments, offpolicy, training  # noqa: F401 - registers the built-in checks
from .base import CHECKS, CheckFn, DoctorThresholds, Finding, Severity, threshold_docs

__all__ = ["CHECKS", "CheckFn", "DoctorThresholds", "Finding", "Severity", "threshold_docs"]
