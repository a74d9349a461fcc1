"""What every doctor check shares: a :class:`Finding`, the :class:`DoctorThresholds` that decide when each check
fires, the :data:`CHECKS` registry (``check(trace, thresholds, batch_info) -> Finding | None``; a user adds one with
``@CHECKS.register("my_check")``) and the window helpers of the trend checks: a trend check compares the first
``window`` steps ("early") with the last ``window`` steps ("recent") of a metric and stays silent on runs shorter
than ``min_steps``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

from grpoplus.core.fielddocs import field_docs
from grpoplus.core.registry import Registry

from ..series import Series, Trace

Severity = Literal["warning", "severe"]


@dataclass(frozen=True)
class Finding:
    """One diagnosis: what fired, the evidence (metric and steps), and the recommended fix."""

    code: str
    severity: Severity
    title: str
    evidence: str
    fix: str

    def one_line(self) -> str:
        """The line the trainer prints when the live doctor fires."""
        return (
            f"[doctor] {self.severity}: {self.code}: {self.title} ({self.evidence}) "
            f"-> fix: {self.fix}"
        )


@dataclass
class DoctorThresholds:
    """When each doctor check fires. Override with ``--threshold name=value``."""

    window: int = 10
    """Steps in the early and the recent window that trend checks compare."""
    min_steps: int = 20
    """Trend checks stay silent until a metric has this many logged steps."""
    entropy_drop_ratio: float = 0.3
    """entropy_collapse: recent/early mean of policy/entropy_mean below this ..."""
    reward_plateau_delta: float = 0.05
    """... while reward/mean rose less than this (fitted line) over the last half of the run."""
    length_growth_ratio: float = 2.0
    """length_explosion: recent/early mean of length/mean at or above this ..."""
    truncation_frac_max: float = 0.2
    """... or recent mean of length/truncated_frac at or above this."""
    incorrect_longer_ratio: float = 1.5
    """incorrect_longer: recent length/incorrect_mean over length/correct_mean at or above this ..."""
    incorrect_longer_growth: float = 0.2
    """... and that ratio grew by at least this since the early window."""
    zero_variance_frac: float = 0.5
    """zero_variance: recent mean of groups/zero_std_frac at or above this (warning)."""
    zero_variance_severe_frac: float = 0.9
    """zero_variance is severe at or above this fraction: almost no group carries a gradient."""
    mismatch_growth_ratio: float = 2.0
    """mismatch_rising: recent/early mean of mismatch/k3 at or above this ..."""
    mismatch_floor: float = 1e-3
    """... and recent mismatch/k3 at or above this (smaller mismatch is numerical noise)."""
    reward_rise_min: float = 0.1
    """reward_hacking: reward/mean rose by at least this (recent minus early mean) ..."""
    eval_stall_delta: float = 0.02
    """... while held-out accuracy (last third minus first third of evals) rose less than this."""
    eval_min_points: int = 3
    """reward_hacking needs at least this many held-out evaluations."""
    noisy_batch_max: int = 64
    """noisy_reward: only for batches of at most this many responses per step ..."""
    noisy_reward_ratio: float = 0.5
    """... whose step-to-step reward noise is at least this fraction of the run's reward trend."""
    nonfinite_severe_count: int = 3
    """nonfinite_updates fires on any skipped update; severe from this many on."""
    grad_spike_ratio: float = 10.0
    """grad_explosion: a spike is a step whose optim/grad_norm exceeds this times the run median ..."""
    grad_spike_count: int = 3
    """... and the check fires at this many spikes ..."""
    grad_growth_ratio: float = 5.0
    """... or when the recent median grad norm is this times the early median."""
    structural_min_steps: int = 5
    """zero_advantage, inert_clipping and routing_mismatch judge a level, not a trend: they need only this many logged steps."""
    inert_ratio_tol: float = 1e-4
    """inert_clipping: loss/ratio_max within this of 1 and no clipped token on every step = every update on-policy."""
    staleness_corr_min: float = 0.5
    """mismatch_with_staleness: rank correlation of async/staleness_mean and mismatch/k3 over the steps at or above this ..."""
    staleness_mismatch_ratio: float = 1.5
    """... and mean mismatch on the staler half of the steps at least this times the fresher half's (and >= mismatch_floor)."""
    turn_limit_frac: float = 0.5
    """turn_limit: recent mean of env/ended/max_turns at or above this (most trajectories cut by the turn limit)."""
    env_failure_frac: float = 0.1
    """env_failures: recent mean share of trajectories ended by an environment error, timeout or malformed answer."""
    tool_error_frac: float = 0.3
    """tool_errors: recent env/tool_errors over env/tool_calls at or above this ..."""
    tool_error_growth: float = 1.5
    """... or that share grew this many times since the early window (the trend needs min_steps)."""
    obs_crowding_frac: float = 0.2
    """observation_crowding: recent mean of env/ended/context at or above this (observations overflow the budget)."""
    opd_min_drop: float = 0.1
    """opd_stalled: opd/reverse_kl must fall by at least this fraction from the early to the recent window ..."""
    opd_kl_floor: float = 0.01
    """... unless its recent mean is below this (the student already matches the teacher)."""
    routing_mismatch_max: float = 0.1
    """routing_mismatch: recent mean of moe/routing_mismatch (share of token-layer expert choices that differ) at or above this."""  # noqa: E501


def threshold_docs() -> dict[str, str]:
    """``{field name: docstring}`` of :class:`DoctorThresholds`, read from its source."""
    return field_docs(DoctorThresholds)


CheckFn = Callable[[Trace, DoctorThresholds, Mapping[str, Any]], "Finding | None"]
CHECKS: Registry[CheckFn] = Registry("doctor check")


def early_recent(series: Series, th: DoctorThresholds) -> tuple[Series, Series] | None:
    """(early, recent) windows of a finite series, or None when it is too short to judge."""
    series = series.finite()
    if len(series) < max(th.min_steps, 2 * th.window):
        return None
    return series.head(th.window), series.tail(th.window)


def natural_layer_keys(trace: Trace, prefix: str) -> list[str]:
    """Keys ``<prefix><i>`` the run logged, in layer order."""
    keys = [k for k in trace.keys() if k.startswith(prefix) and k[len(prefix):].isdigit()]
    return sorted(keys, key=lambda k: int(k[len(prefix):]))


def change_ratio(new: float, old: float) -> float:
    return new / old if old > 0 else float("inf") if new > 0 else 1.0
