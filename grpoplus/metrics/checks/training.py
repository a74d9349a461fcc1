"""The doctor's checks of single-turn training: entropy, length, variance, advantage, mismatch, reward hacking,
noise, non-finite updates and gradient explosions."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..series import Series, Trace, step_noise
from ..signals import SIGNALS_BY_CODE
from .base import CHECKS, DoctorThresholds, Finding, Severity, change_ratio, early_recent


@CHECKS.register("entropy_collapse")
def check_entropy_collapse(trace: Trace, th: DoctorThresholds, info: Mapping) -> Finding | None:
    """Entropy falls fast while reward stops improving: the policy stopped exploring
    (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs"; DAPO section 3.1)."""
    ent = early_recent(trace.get("policy/entropy_mean"), th)
    reward = trace.get("reward/mean").finite()
    if ent is None or len(reward) < th.min_steps:
        return None
    early, recent = ent
    ratio = change_ratio(recent.mean(), early.mean())
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
    length = early_recent(trace.get("length/mean"), th)
    if length is not None:
        early, recent = length
        growth = change_ratio(recent.mean(), early.mean())
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

    def length_ratio(window: list[float]) -> float:
        return change_ratio(sum(bad_by[s] for s in window), sum(good_by[s] for s in window))

    early, recent = length_ratio(early_steps), length_ratio(recent_steps)
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
    no_spread = SIGNALS_BY_CODE["no_spread"]  # the health guard's definition of the signal
    if not all(no_spread.fires({"groups/zero_std_frac": v}, info) for v in recent.values):
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
    windows = None if series is None else early_recent(series, th)
    if windows is None:
        return None
    early, recent = windows
    growth = change_ratio(recent.mean(), early.mean())
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
    reward = early_recent(trace.get("reward/mean"), th)
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
    growth = change_ratio(float(np.median(recent.values)), float(np.median(early.values)))
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
