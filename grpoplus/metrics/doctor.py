"""The run doctor: read a run's metric trajectories and say what is wrong and what to switch.

Each check is a registered function ``check(trace, thresholds, batch_info) -> Finding | None``
in :data:`CHECKS`; a user adds one with ``@CHECKS.register("my_check")``. Trend checks compare
the first ``window`` steps ("early") with the last ``window`` steps ("recent") of a metric and
stay silent on runs shorter than ``min_steps``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np

from grpoplus.registry import Registry

from .series import Series, Trace, step_noise

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
    tree = ast.parse(inspect.getsource(DoctorThresholds))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr):
            docs[node.target.id] = after.value.value  # type: ignore[attr-defined]
    return docs


def parse_thresholds(overrides: Sequence[str]) -> DoctorThresholds:
    """``["window=20", "zero_variance_frac=0.7"]`` -> thresholds; a bad name or value is a
    ValueError that lists the valid names."""
    fields = {f.name: f for f in dataclasses.fields(DoctorThresholds)}
    values: dict[str, Any] = {}
    for item in overrides:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or name not in fields:
            raise ValueError(
                f"unknown doctor threshold {item!r}; use name=value with name one of: "
                f"{', '.join(fields)}"
            )
        kind = int if fields[name].type in (int, "int") else float
        try:
            values[name] = kind(raw)
        except ValueError:
            raise ValueError(f"threshold {name!r} needs a {kind.__name__}, got {raw!r}") from None
    return DoctorThresholds(**values)


CheckFn = Callable[[Trace, DoctorThresholds, Mapping[str, Any]], "Finding | None"]
CHECKS: Registry[CheckFn] = Registry("doctor check")


def diagnose(
    records: Sequence[dict[str, Any]],
    thresholds: DoctorThresholds | None = None,
    batch_info: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """Run every registered check over a run's records; an empty list means healthy.

    Args:
        records: per-step dicts as read by :func:`grpoplus.metrics.read_metrics`.
        thresholds: when each check fires (defaults: :class:`DoctorThresholds`).
        batch_info: facts of the setup from the config (see :func:`batch_info_from_config`),
            e.g. ``{"responses": 256, "group_size": 8, "loss": "clip", "updates_per_batch": 1}``.
    """
    trace = Trace(records)
    th = thresholds or DoctorThresholds()
    info = dict(batch_info or {})
    findings = [CHECKS.get(name)(trace, th, info) for name in CHECKS.names()]
    return [f for f in findings if f is not None]


def batch_info_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The setup facts some checks need, from a resolved config as a nested dict
    (``config.yaml``, or ``Config.to_dict()``); keys the config lacks are left out.

    ``responses`` (trained per step) = prompts_per_step x group_size; ``updates_per_batch``
    = num_iterations x num_minibatches (optimizer steps per rollout batch).
    """
    rollout, algo = config.get("rollout") or {}, config.get("algo") or {}
    info: dict[str, Any] = {k: rollout[k] for k in ("group_size", "max_staleness") if k in rollout}
    info.update({k: algo[k] for k in ("loss", "adv_estimator", "routing_replay") if k in algo})
    if "group_size" in rollout and "prompts_per_step" in rollout:
        info["responses"] = rollout["prompts_per_step"] * rollout["group_size"]
    if "num_iterations" in algo or "num_minibatches" in algo:
        info["updates_per_batch"] = algo.get("num_iterations", 1) * algo.get("num_minibatches", 1)
    return info


class LiveDoctor:
    """Runs :func:`diagnose` during training and returns only findings not reported before
    (a finding that escalates from warning to severe is reported again, once).

    Example::

        doctor = LiveDoctor(batch_info=batch_info_from_config(cfg.to_dict()), every=10)
        if doctor.due(step):
            for finding in doctor.check(records_so_far):
                print(finding.one_line())
    """

    def __init__(
        self,
        thresholds: DoctorThresholds | None = None,
        batch_info: Mapping[str, Any] | None = None,
        every: int = 10,
    ):
        self.thresholds = thresholds or DoctorThresholds()
        self.batch_info = batch_info
        self.every = every
        self._reported: set[tuple[str, str]] = set()

    def due(self, step: int) -> bool:
        """Check every ``every`` steps, and once at ``structural_min_steps`` so a setup that
        cannot learn (zero advantage, inert clipping) is named before the first period ends;
        ``every=0`` turns the live doctor off."""
        if self.every <= 0 or step <= 0:
            return False
        return step % self.every == 0 or step == self.thresholds.structural_min_steps

    def check(self, records: Sequence[dict[str, Any]]) -> list[Finding]:
        """Diagnose ``records`` (all steps so far); return only the findings not reported yet."""
        new = []
        for finding in diagnose(records, self.thresholds, self.batch_info):
            key = (finding.code, finding.severity)
            if key not in self._reported:
                self._reported.add(key)
                new.append(finding)
        return new


def _windows(series: Series, th: DoctorThresholds) -> tuple[Series, Series] | None:
    """(early, recent) windows of a finite series, or None when it is too short to judge."""
    series = series.finite()
    if len(series) < max(th.min_steps, 2 * th.window):
        return None
    return series.head(th.window), series.tail(th.window)


def _natural_layer_keys(trace: Trace, prefix: str) -> list[str]:
    """Keys ``<prefix><i>`` the run logged, in layer order."""
    keys = [k for k in trace.keys() if k.startswith(prefix) and k[len(prefix):].isdigit()]
    return sorted(keys, key=lambda k: int(k[len(prefix):]))


def _ratio(new: float, old: float) -> float:
    return new / old if old > 0 else float("inf") if new > 0 else 1.0


@CHECKS.register("entropy_collapse")
def check_entropy_collapse(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Entropy falls fast while reward stops improving: the policy stopped exploring
    (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"; DAPO section 3.1)."""
    ent = _windows(trace.get("policy/entropy_mean"), th)
    reward = trace.get("reward/mean").finite()
    if ent is None or len(reward) < th.min_steps:
        return None
    early, recent = ent
    ratio = _ratio(recent.mean(), early.mean())
    late_reward = reward.tail(max(th.window, len(reward) // 2))
    gain = late_reward.fitted_change()
    if ratio >= th.entropy_drop_ratio or gain >= th.reward_plateau_delta:
        return None
    return Finding(
        "entropy_collapse", "warning", "policy entropy collapsed and reward plateaued",
        f"policy/entropy_mean {early.mean():.3g} ({early.span()}) -> {recent.mean():.3g} "
        f"({recent.span()}), ratio {ratio:.2f} < {th.entropy_drop_ratio}; reward/mean changed "
        f"{gain:+.3f} over {late_reward.span()} (< {th.reward_plateau_delta})",
        "keep exploration alive: clip-higher (DAPO: algo.eps_high=0.28), CISPO "
        "(MiniMax-M1: --preset cispo), or a KL penalty with reference reset "
        "(ProRL: algo.beta=0.001 algo.ref_reset_every=100)",
    )


@CHECKS.register("length_explosion")
def check_length_explosion(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Responses grow until they hit the length limit (DAPO section 3.3-3.4; Dr. GRPO)."""
    evidence = []
    length = _windows(trace.get("length/mean"), th)
    if length is not None:
        early, recent = length
        growth = _ratio(recent.mean(), early.mean())
        if growth >= th.length_growth_ratio:
            evidence.append(
                f"length/mean {early.mean():.1f} ({early.span()}) -> {recent.mean():.1f} "
                f"({recent.span()}), x{growth:.1f} >= {th.length_growth_ratio}"
            )
    trunc = trace.get("length/truncated_frac").finite()
    if len(trunc) >= th.window:
        recent = trunc.tail(th.window)
        if recent.mean() >= th.truncation_frac_max:
            evidence.append(
                f"length/truncated_frac {recent.mean():.2f} over {recent.span()} "
                f">= {th.truncation_frac_max}"
            )
    if not evidence:
        return None
    return Finding(
        "length_explosion", "warning", "response length is exploding", "; ".join(evidence),
        "remove the length bias and shape overlong answers: token-level loss (DAPO: "
        "algo.aggregation=token_mean) or Dr. GRPO aggregation "
        "(algo.aggregation=seq_mean_token_sum_norm, algo.adv_estimator=dr_grpo), soft overlong "
        "punishment / filtering (DAPO: algo.overlong_shaping=true, algo.overlong_filter=true)",
    )


@CHECKS.register("incorrect_longer")
def check_incorrect_longer(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Wrong answers grow longer than right ones: GRPO's per-sequence normalisation favours
    long wrong answers (Dr. GRPO, Liu et al. 2025, section 3.1). Silent on a multi-turn run: a failed episode is
    longer because it ran out of turns, not because a long answer was rewarded."""
    if trace.has("env/turns_mean"):
        return None
    bad = trace.get("length/incorrect_mean").finite()
    good = trace.get("length/correct_mean").finite()
    common = set(bad.steps.tolist()) & set(good.steps.tolist())
    if len(common) < max(th.min_steps, 2 * th.window):
        return None
    steps = sorted(common)
    bad_by = dict(zip(bad.steps.tolist(), bad.values.tolist()))
    good_by = dict(zip(good.steps.tolist(), good.values.tolist()))
    early_steps, recent_steps = steps[: th.window], steps[-th.window :]

    def ratio(window: list[float]) -> float:
        return _ratio(sum(bad_by[s] for s in window), sum(good_by[s] for s in window))

    early, recent = ratio(early_steps), ratio(recent_steps)
    if recent < th.incorrect_longer_ratio or recent - early < th.incorrect_longer_growth:
        return None
    return Finding(
        "incorrect_longer", "warning", "incorrect responses are growing longer than correct ones",
        f"length/incorrect_mean over length/correct_mean {early:.2f} (steps "
        f"{int(early_steps[0])}-{int(early_steps[-1])}) -> {recent:.2f} (steps "
        f"{int(recent_steps[0])}-{int(recent_steps[-1])}), >= {th.incorrect_longer_ratio}",
        "stop rewarding long wrong answers: token-level loss (DAPO: algo.aggregation=token_mean), "
        "Dr. GRPO (--preset dr_grpo: no std, seq_mean_token_sum_norm), overlong shaping "
        "(algo.overlong_shaping=true)",
    )


def _oversample(trace: Trace) -> Series | None:
    """Groups drawn per group needed (dynamic sampling / zero-variance filtering); read from
    ``sampling/oversample``, or from the older ``sampling/kept_frac`` (kept / drawn)."""
    series = trace.first_present("sampling/oversample")
    if series is not None:
        return series
    kept = trace.first_present("sampling/kept_frac")
    if kept is None or not (kept.values > 0).all():
        return None
    return Series("sampling/oversample", kept.steps, 1.0 / kept.values)


@CHECKS.register("zero_variance")
def check_zero_variance(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Groups whose rewards are all equal have zero advantage and teach nothing (DAPO 3.2).
    Counted over every group drawn; with dynamic sampling they cost sampling time instead."""
    frac = trace.get("groups/zero_std_frac").finite()
    if len(frac) < th.window:
        return None
    recent = frac.tail(th.window)
    level = recent.mean()
    if level < th.zero_variance_frac or recent.values.min() >= 1.0:
        return None  # every recent step without any spread: zero_advantage says more
    right = trace.get("groups/all_correct_frac").finite().tail(th.window).mean()
    wrong = trace.get("groups/all_wrong_frac").finite().tail(th.window).mean()
    evidence = f"groups/zero_std_frac {level:.2f} over {recent.span()} >= {th.zero_variance_frac}"
    data_fix = "make the data harder or easier (curriculum)"
    if np.isfinite(right) and np.isfinite(wrong):  # both logged
        evidence += f" (all correct {right:.2f}, all wrong {wrong:.2f})"
        data_fix = "use harder prompts" if right > wrong else "use easier prompts (curriculum)"
    sampling_fix = ("dynamic sampling (DAPO: algo.dynamic_sampling=true) or zero-variance "
                    "filtering (algo.zero_variance_filter=true)")
    oversample = _oversample(trace)
    if oversample is not None and oversample.tail(th.window).mean() > 1.0:
        evidence += (f"; dynamic sampling draws {oversample.tail(th.window).mean():.2f}x the "
                     "groups it trains on (sampling/oversample)")
        sampling_fix = "dynamic sampling already drops them, at that sampling cost"
    severity: Severity = "severe" if level >= th.zero_variance_severe_frac else "warning"
    return Finding(
        "zero_variance", severity, "most groups have zero reward spread", evidence,
        f"{sampling_fix}; {data_fix}; a larger group (rollout.group_size)",
    )


@CHECKS.register("zero_advantage")
def check_zero_advantage(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Every advantage is zero, so no update can change the policy: a group of one response
    is its own baseline, and a group whose rewards are all equal has ``R_i - mean_g R = 0``
    (ALGORITHMS.md section 1). Judged on the first ``structural_min_steps`` steps already."""
    if info.get("group_size") == 1:
        return Finding(
            "zero_advantage", "severe", "every advantage is zero: training cannot learn",
            "rollout.group_size = 1: each response is its own group baseline, R_i - mean_g R = 0",
            "sample several responses per prompt (rollout.group_size >= 4)",
        )
    frac = trace.get("groups/zero_std_frac").finite()
    if len(frac) < th.structural_min_steps:
        return None
    recent = frac.tail(th.structural_min_steps)
    if recent.values.min() < 1.0:
        return None
    return Finding(
        "zero_advantage", "severe", "every advantage is zero: training cannot learn",
        f"groups/zero_std_frac = 1 on every step of {recent.span()}: no group had two "
        "different rewards",
        "check the reward on samples.jsonl (constant? always 0 because the answer format "
        "never parses?); use prompts the policy sometimes solves, or a model that already "
        "solves some (SFT / warm start); a larger group (rollout.group_size)",
    )


@CHECKS.register("mismatch_rising")
def check_mismatch_rising(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Sampler and learner probabilities drift apart (Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"; ALGORITHMS.md section 5)."""
    series = trace.first_present("mismatch/k3", "mismatch/abs_p_diff_mean")
    windows = None if series is None else _windows(series, th)
    if windows is None:
        return None
    early, recent = windows
    growth = _ratio(recent.mean(), early.mean())
    if growth < th.mismatch_growth_ratio or recent.mean() < th.mismatch_floor:
        return None
    active = sorted({k.split("/")[1] for k in trace.keys() if k.startswith("correction/")})
    fix = (
        "correct the off-policy gap: truncated importance sampling (algo.corrections=[tis_token]) "
        "or a geometric-mean mask (algo.corrections=[geo_mask]) (ALGORITHMS.md section 5)"
    )
    if active:
        fix += f"; corrections already on ({', '.join(active)}): check sampler/learner precision"
    return Finding(
        "mismatch_rising", "warning", "sampler/learner mismatch is rising",
        f"{series.key} {early.mean():.3g} ({early.span()}) -> {recent.mean():.3g} "
        f"({recent.span()}), x{growth:.1f} >= {th.mismatch_growth_ratio}",
        fix,
    )


@CHECKS.register("reward_hacking")
def check_reward_hacking(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Training reward rises while held-out accuracy does not: the policy learned the reward,
    not the task (Skalse et al. 2022, "Defining and characterizing reward hacking")."""
    evals = trace.first_present("eval/accuracy", "eval/accuracy_sampled")
    reward = _windows(trace.get("reward/mean"), th)
    if evals is None or reward is None or len(evals) < th.eval_min_points:
        return None
    third = max(1, len(evals) // 3)
    eval_early, eval_recent = evals.head(third), evals.tail(third)
    rise = reward[1].mean() - reward[0].mean()
    eval_gain = eval_recent.mean() - eval_early.mean()
    if rise < th.reward_rise_min or eval_gain >= th.eval_stall_delta:
        return None
    return Finding(
        "reward_hacking", "warning", "training reward rises but held-out accuracy stalls",
        f"reward/mean {reward[0].mean():.3f} ({reward[0].span()}) -> {reward[1].mean():.3f} "
        f"({reward[1].span()}); {evals.key} {eval_early.mean():.3f} ({eval_early.span()}) -> "
        f"{eval_recent.mean():.3f} ({eval_recent.span()}), gain {eval_gain:+.3f} "
        f"< {th.eval_stall_delta}",
        "reward hacking or overfitting: audit the reward on samples.jsonl (format-only "
        "credit? parser loopholes?), hold out more data, stop at the best eval checkpoint",
    )


def _batch_responses(trace: Trace, info: Mapping[str, Any]) -> float | None:
    """Responses the update trained on per step (``batch/responses``; runs written before
    ``drawn/*`` existed counted every drawn response there)."""
    batch = trace.get("batch/responses").finite()
    if len(batch):
        return float(batch.values[-1])
    value = info.get("responses")
    return None if value is None else float(value)


@CHECKS.register("noisy_reward")
def check_noisy_reward(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Small batches: the step-to-step noise of the batch reward drowns its trend, so the
    gradient is mostly noise (the batch-mean variance shrinks as 1/batch)."""
    responses = _batch_responses(trace, info)
    reward = trace.get("reward/mean").finite()
    if responses is None or responses > th.noisy_batch_max or len(reward) < th.min_steps:
        return None
    noise = step_noise(reward.values)
    trend = abs(reward.fitted_change())
    if noise < th.noisy_reward_ratio * trend or noise == 0.0:
        return None
    group = info.get("group_size")
    group_txt = f" (group size {int(group)})" if group else ""
    return Finding(
        "noisy_reward", "warning", "reward is noisy and the batch is small",
        f"reward/mean step-to-step noise {noise:.3f} vs trend {trend:+.3f} over "
        f"{reward.span()} (noise >= {th.noisy_reward_ratio} x trend) with "
        f"{int(responses)} responses trained per step{group_txt} <= {th.noisy_batch_max}",
        "use a larger batch (more prompts per step) or a larger group (rollout.group_size)",
    )


@CHECKS.register("nonfinite_updates")
def check_nonfinite_updates(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Updates skipped because the loss or gradient was NaN/inf."""
    skipped = trace.get("optim/skipped_updates").finite()
    bad_steps = skipped.steps[skipped.values > 0].astype(int).tolist()
    total = trace.get("optim/skipped_total").finite()
    for key in ("loss/total", "optim/grad_norm"):
        series = trace.get(key)
        bad_steps += series.steps[~np.isfinite(series.values)].astype(int).tolist()
    bad_steps = sorted(set(bad_steps))
    count = max(
        int(skipped.values.sum()), int(total.values[-1]) if len(total) else 0, len(bad_steps)
    )
    if count == 0:
        return None
    shown = ", ".join(map(str, bad_steps[:10])) + (" ..." if len(bad_steps) > 10 else "")
    severity: Severity = "severe" if count >= th.nonfinite_severe_count else "warning"
    return Finding(
        "nonfinite_updates", severity, "non-finite loss or gradient: updates skipped",
        f"{count} non-finite/skipped update(s) (optim/skipped_updates, loss/total, "
        f"optim/grad_norm) at steps {shown or 'unknown'}",
        "lower the learning rate, keep gradient clipping on, compute log-probs in float32, "
        "and check for empty responses or extreme log-ratios",
    )


@CHECKS.register("grad_explosion")
def check_grad_explosion(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Gradient norm spikes far above its median, or climbs steadily."""
    grad = trace.get("optim/grad_norm").finite()
    if len(grad) < th.min_steps:
        return None
    median = float(np.median(grad.values))
    spikes = grad.steps[grad.values > th.grad_spike_ratio * median].astype(int).tolist()
    early, recent = grad.head(th.window), grad.tail(th.window)
    growth = _ratio(float(np.median(recent.values)), float(np.median(early.values)))
    evidence = []
    if len(spikes) >= th.grad_spike_count:
        evidence.append(
            f"optim/grad_norm above {th.grad_spike_ratio} x median ({median:.3g}) at "
            f"{len(spikes)} steps ({', '.join(map(str, spikes[:10]))})"
        )
    if growth >= th.grad_growth_ratio:
        evidence.append(
            f"median optim/grad_norm x{growth:.1f} from {early.span()} to {recent.span()}"
        )
    if not evidence:
        return None
    return Finding(
        "grad_explosion", "severe", "gradient norm is exploding", "; ".join(evidence),
        "lower the learning rate, clip gradients (learner max grad norm 1.0), check the "
        "mismatch metrics and use a ratio-bounded loss (algo.loss=cispo or tis corrections)",
    )


from . import distill_checks, env_checks, offpolicy_checks  # noqa: E402,F401  (register the distillation, multi-turn and off-policy checks)
