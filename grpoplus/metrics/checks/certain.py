"""The doctor's checks of the certain-failure signals that no trend check covers (every completion truncated, the
engine off the learner after a weight sync), judged from the first step: one definition of each signal
(:mod:`grpoplus.metrics.signals`), read here after the run and by the health guard during it."""

from __future__ import annotations

from typing import Mapping

from ..series import Trace
from ..signals import SIGNALS_BY_CODE, Signal
from .base import CHECKS, DoctorThresholds, Finding, Severity


def signal_finding(signal: Signal, trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """A finding where ``signal`` fired on any trained step: severe when it fired on each of the last
    ``structural_min_steps`` steps (or on every step of a shorter run)."""
    trained = [r for r in trace.records if r["step"] > 0]
    fires = [signal.fires(r, info) for r in trained]
    hits = [r for r, hit in zip(trained, fires) if hit]
    if not hits:
        return None
    severity: Severity = "severe" if all(fires[-th.structural_min_steps:]) else "warning"
    steps = [int(r["step"]) for r in hits]
    shown = ", ".join(map(str, steps[:10])) + (" ..." if len(steps) > 10 else "")
    latest = hits[-1]
    return Finding(signal.code, severity, signal.title,
                   f"on {len(steps)} of {len(trained)} steps ({shown}); step {steps[-1]}: "
                   f"{signal.evidence(latest, info)}", signal.fix)


@CHECKS.register("all_truncated")
def check_all_truncated(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Every completion of a step was cut at the length limit: its rewards judge unfinished answers."""
    return signal_finding(SIGNALS_BY_CODE["all_truncated"], trace, th, info)


@CHECKS.register("sync_gap")
def check_sync_gap(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """The engine sampled with weights the learner does not hold (ALGORITHMS.md section 5): a stale weight sync."""
    return signal_finding(SIGNALS_BY_CODE["sync_gap"], trace, th, info)
