"""Doctor checks of multi-turn runs (grpoplus.envs): turn limits, failing environments, tool errors, observations
crowding out the budget. Registered in :data:`grpoplus.metrics.checks.CHECKS` on import; silent on single-turn runs
(they log no ``env/*`` metric)."""

from __future__ import annotations

from typing import Mapping

from ..series import Series, Trace
from ..signals import ENV_FAILURES as FAILURES
from .base import CHECKS, DoctorThresholds, Finding


def _recent(trace: Trace, key: str, th: DoctorThresholds) -> Series | None:
    """The last ``window`` finite values of ``key``, once it has ``structural_min_steps`` of them."""
    series = trace.get(key).finite()
    return series.tail(th.window) if len(series) >= th.structural_min_steps else None


@CHECKS.register("turn_limit")
def check_turn_limit(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Most trajectories end at the turn limit: the policy never finishes, so the reward sees cut-off episodes."""
    cut = _recent(trace, "env/ended/max_turns", th)
    if cut is None or cut.mean() < th.turn_limit_frac:
        return None
    return Finding(
        "turn_limit", "warning", "most trajectories hit the turn limit",
        f"env/ended/max_turns {cut.mean():.2f} over {cut.span()} (>= {th.turn_limit_frac})",
        "raise rollout.max_turns if episodes need more turns; otherwise the policy loops: a per-turn cost in the "
        "environment's reward, or algo.turn_credit=return_to_go to credit the turns that make progress")


@CHECKS.register("env_failures")
def check_env_failures(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Environments raise, hang or answer malformed values on a share of the trajectories (each counted, none
    trained on as a success)."""
    parts = [(key, _recent(trace, key, th)) for key in FAILURES]
    parts = [(key, s) for key, s in parts if s is not None]
    total = sum(s.mean() for _, s in parts)
    if not parts or total < th.env_failure_frac:
        return None
    shown = ", ".join(f"{key.rsplit('/', 1)[1]} {s.mean():.2f}" for key, s in parts if s.mean() > 0)
    return Finding(
        "env_failures", "severe" if total >= 0.5 else "warning", "environments fail on many trajectories",
        f"{total:.2f} of trajectories ended by a failing environment over {parts[0][1].span()} ({shown})",
        "read the first failure of each kind on stderr ('an environment's step ...'); a timeout: raise "
        "rollout.env_timeout_s or make the step faster (async def steps are awaited concurrently); malformed: step "
        "must return (observation, reward, done, info)")


@CHECKS.register("tool_errors")
def check_tool_errors(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """A large or growing share of tool calls fail (unknown tool, bad JSON, the tool raised)."""
    calls, errors = trace.get("env/tool_calls").finite(), trace.get("env/tool_errors").finite()
    if len(calls) < th.structural_min_steps or calls.tail(th.window).values.sum() == 0:
        return None
    share = errors.tail(th.window).values.sum() / calls.tail(th.window).values.sum()
    early_calls = calls.head(th.window).values.sum()
    early = errors.head(th.window).values.sum() / early_calls if early_calls else 0.0
    growing = len(calls) >= th.min_steps and early > 0 and share >= th.tool_error_growth * early
    if share < th.tool_error_frac and not growing:
        return None
    return Finding(
        "tool_errors", "warning", "tool calls fail" + (" more and more" if growing else ""),
        f"env/tool_errors / env/tool_calls {share:.2f} over {calls.tail(th.window).span()}"
        + (f" (early {early:.2f})" if growing else ""),
        "look at samples.jsonl: the model's calls and the errors returned; state the call format and the tools' "
        "arguments plainly in the system prompt, check each tool's Args: docstring (its schema), or lower "
        "rollout.temperature")


@CHECKS.register("observation_crowding")
def check_observation_crowding(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Observations overflow the trajectory's budget or the context, ending trajectories before the policy answers."""
    cut = _recent(trace, "env/ended/context", th)
    if cut is None or cut.mean() < th.obs_crowding_frac:
        return None
    share = _recent(trace, "env/obs_token_frac", th)
    return Finding(
        "observation_crowding", "warning", "observations crowd out the token budget",
        f"env/ended/context {cut.mean():.2f} over {cut.span()} (>= {th.obs_crowding_frac})"
        + (f"; observations are {share.mean():.0%} of trajectory tokens" if share is not None else ""),
        "shorten what the environment returns (truncate tool output), raise rollout.max_episode_tokens, or use a "
        "model with a longer context")
