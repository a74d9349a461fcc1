"""The health guard: reads each step's record as the run writes it, prints a warning line the step a certain-failure
signal (:mod:`grpoplus.metrics.signals`) fires, and stops a run that has learned nothing for ``health.stop_after``
consecutive steps, so that it does not spend hours sampling for an update that cannot come.

The doctor reads the same signals after the run (its checks of the same codes); the guard acts during it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .signals import fired


class HealthStop(RuntimeError):
    """The guard stopped the run: the reason, the steps and what to change (one line); the run's checkpoint is
    written before it is raised."""


@dataclass(frozen=True, kw_only=True)
class GuardPlan:
    """The guard's part of the config (the ``health`` section)."""

    warn: bool = True
    stop_after: int = 20  # consecutive steps without a learning signal before the run stops (0: never)


class HealthGuard:
    """Per step: :meth:`observe` returns the lines to print; :attr:`stop_reason` is set once the run must stop."""

    def __init__(self, plan: GuardPlan, info: Mapping[str, Any], history: Sequence[Mapping[str, Any]] = ()):
        self.plan, self.info = plan, dict(info)
        self.barren: list[int] = []  # the latest run of consecutive steps that taught nothing
        self.causes: dict[str, int] = {}
        self.stop_reason: str | None = None
        for record in history:  # a resumed run counts the steps it had already run
            if record.get("step", 0) > 0:
                self._count(record)

    def observe(self, step: int, record: Mapping[str, Any]) -> list[str]:
        """The warning lines for this step's record (none when healthy or ``health.warn`` is off)."""
        signals = self._count(record)
        lines = [s.line(step, record, self.info) for s in signals] if self.plan.warn else []
        if self.plan.stop_after and len(self.barren) >= self.plan.stop_after:
            self.stop_reason = self._reason()
        return lines

    def _count(self, record: Mapping[str, Any]):
        signals = fired(record, self.info)
        barren = [s.code for s in signals if s.no_learning]  # the step taught nothing (signals.learns)
        if not barren:
            self.barren, self.causes = [], {}
        else:
            self.barren.append(int(record["step"]))
            for code in barren:
                self.causes[code] = self.causes.get(code, 0) + 1
        return signals

    def _reason(self) -> str:
        causes = ", ".join(f"{code} on {n}" for code, n in self.causes.items())
        return (f"no learning signal for {len(self.barren)} consecutive steps ({self.barren[0]}-{self.barren[-1]}: "
                f"{causes}); the run stopped rather than sample on for nothing (health.stop_after="
                f"{self.plan.stop_after}; 0 turns the stop off)")
