"""Synthetic metric traces: a healthy run and one run per doctor finding.

Each generator returns a list of per-step records like the trainer writes. They start
from the same healthy run and change only the metrics of the failure they show, so a test
can demand *exactly* the expected set of findings.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest


def healthy_trace(n: int = 60, seed: int = 0, batch: int = 128) -> list[dict]:
    """Reward and held-out accuracy rise together; entropy declines gently; lengths grow
    slowly with wrong answers a constant ~1.2x longer; low mismatch; steady gradients."""
    rng = np.random.default_rng(seed)
    records = []
    for t in range(n):
        progress = 1.0 - np.exp(-t / 25.0)
        reward = 0.2 + 0.5 * progress + rng.normal(0, 0.02)
        r = {
            "step": t,
            "time/elapsed_s": 2.0 * t,
            "reward/mean": reward,
            "reward/std": 0.4,
            "reward/correct/mean": reward,
            "reward/format/mean": 0.9,
            "reward/accuracy": reward,
            "groups/zero_std_frac": 0.2 + rng.normal(0, 0.02),
            "groups/all_correct_frac": 0.1,
            "groups/all_wrong_frac": 0.1,
            "length/mean": 100 + 30 * progress + rng.normal(0, 2),
            "length/max": 200.0,
            "length/correct_mean": 90 + 25 * progress,
            "length/incorrect_mean": (90 + 25 * progress) * 1.2,
            "length/truncated_frac": 0.02,
            "policy/entropy_mean": 1.0 - 0.25 * progress + rng.normal(0, 0.01),
            "policy/entropy_p10": 0.002 * (1.0 - 0.5 * progress),
            "policy/entropy_p25": 0.02 * (1.0 - 0.5 * progress),
            "loss/policy": rng.normal(0, 0.01),
            "loss/total": rng.normal(0, 0.01),
            "loss/clip_frac_low": 0.01,
            "loss/clip_frac_high": 0.02,
            "loss/ratio_mean": 1.0,
            "loss/ratio_max": 1.3,
            "loss/approx_kl": 1e-3,
            "optim/grad_norm": 0.5 + abs(rng.normal(0, 0.05)),
            "optim/lr": 1e-6,
            "optim/skipped_updates": 0,
            "optim/skipped_total": 0,
            "mismatch/abs_p_diff_mean": 1e-3,
            "mismatch/abs_p_diff_max": 0.05,
            "mismatch/k1": 1e-4,
            "mismatch/k3": 2e-4 * (1 + rng.normal(0, 0.1)),
            "time/rollout_s": 1.2,
            "time/reward_s": 0.1,
            "time/learner_s": 0.6,
            "time/step_s": 2.0,
            "throughput/rollout_tok_s": 9000 + rng.normal(0, 300),
            "throughput/learner_tok_s": 15000 + rng.normal(0, 500),
            "drawn/prompts": batch // 8,
            "drawn/responses": batch,
            "batch/prompts": batch // 8,
            "batch/responses": batch,
        }
        if t % 10 == 0 or t == n - 1:
            r["eval/accuracy"] = 0.15 + 0.45 * progress
            r["eval/pass@4"] = 0.3 + 0.45 * progress
        records.append(r)
    return records


def _set(records: list[dict], key: str, fn) -> list[dict]:
    for r in records:
        r[key] = fn(r["step"])
    return records


def entropy_collapse_trace() -> list[dict]:
    """Entropy drops to a tenth within ~20 steps; reward (and eval) rise then go flat."""
    records = healthy_trace()
    _set(records, "policy/entropy_mean", lambda t: 0.08 + 0.92 * np.exp(-t / 6.0))
    level = lambda t: 0.2 + 0.25 * min(t, 20) / 20  # noqa: E731
    _set(records, "reward/mean", level)
    for r in records:
        if "eval/accuracy" in r:
            r["eval/accuracy"] = level(r["step"]) - 0.05
    return records


def length_explosion_trace() -> list[dict]:
    """All lengths grow 4x and a third of responses hit the limit; correct/incorrect ratio fixed."""
    records = healthy_trace()
    _set(records, "length/mean", lambda t: 100 * (1 + 3 * t / 59))
    _set(records, "length/correct_mean", lambda t: 90 * (1 + 3 * t / 59))
    _set(records, "length/incorrect_mean", lambda t: 108 * (1 + 3 * t / 59))
    return _set(records, "length/truncated_frac", lambda t: 0.02 + 0.35 * t / 59)


def incorrect_longer_trace() -> list[dict]:
    """Wrong answers grow from 1.2x to 2.5x the length of right ones; mean length < 2x."""
    records = healthy_trace()
    _set(records, "length/correct_mean", lambda t: 90.0)
    _set(records, "length/incorrect_mean", lambda t: 108 + 117 * t / 59)
    return _set(records, "length/mean", lambda t: 100 + 60 * t / 59)


def zero_variance_trace(level: float = 0.7) -> list[dict]:
    """Most groups are all wrong: no reward spread, no advantage."""
    records = healthy_trace()
    _set(records, "groups/zero_std_frac", lambda t: level)
    _set(records, "groups/all_correct_frac", lambda t: 0.1)
    return _set(records, "groups/all_wrong_frac", lambda t: level - 0.1)


def mismatch_rising_trace() -> list[dict]:
    """Sampler/learner k3 grows 25x over the run."""
    return _set(healthy_trace(), "mismatch/k3", lambda t: 2e-4 * (1 + 24 * t / 59))


def reward_hacking_trace() -> list[dict]:
    """Training reward climbs from 0.2 to 0.7 while held-out accuracy stays at 0.3."""
    records = healthy_trace()
    for r in records:
        if "eval/accuracy" in r:
            r["eval/accuracy"] = 0.3 + 0.005 * (r["step"] % 20 == 0)
    return records


def noisy_reward_trace() -> list[dict]:
    """16 responses per step and a flat, noisy reward (held-out accuracy flat too)."""
    rng = np.random.default_rng(1)
    records = healthy_trace(batch=16)
    _set(records, "reward/mean", lambda t: 0.3 + rng.normal(0, 0.12))
    for r in records:
        if "eval/accuracy" in r:
            r["eval/accuracy"] = 0.3
    return records


def nonfinite_trace(bad_steps: tuple[int, ...] = (30, 41, 52)) -> list[dict]:
    """Updates skipped for a NaN loss / inf gradient at ``bad_steps``."""
    records = healthy_trace()
    for r in records:
        if r["step"] in bad_steps:
            r["loss/total"] = float("nan")
            r["optim/grad_norm"] = float("inf")
            r["optim/skipped_updates"] = 1
        r["optim/skipped_total"] = sum(s <= r["step"] for s in bad_steps)
    return records


def grad_explosion_trace() -> list[dict]:
    """Finite gradient-norm spikes 40x the median at four steps."""
    records = healthy_trace()
    for r in records:
        if r["step"] in (25, 33, 47, 55):
            r["optim/grad_norm"] = 20.0
    return records


def inert_clipping_trace() -> list[dict]:
    """One update per rollout batch: the ratio to pi_old is exactly 1, nothing is clipped."""
    records = healthy_trace()
    for key in ("loss/clip_frac_low", "loss/clip_frac_high"):
        _set(records, key, lambda t: 0.0)
    _set(records, "loss/ratio_mean", lambda t: 1.0)
    return _set(records, "loss/ratio_max", lambda t: 1.0)


def zero_advantage_trace(n: int = 60) -> list[dict]:
    """Every group of every step has one reward value (e.g. a reward that never parses)."""
    records = healthy_trace(n)
    _set(records, "groups/zero_std_frac", lambda t: 1.0)
    _set(records, "groups/all_correct_frac", lambda t: 0.0)
    return _set(records, "groups/all_wrong_frac", lambda t: 1.0)


def staleness_trace(coupled: bool = True) -> list[dict]:
    """Asynchronous rollouts with 0-3 policy versions of staleness per step; with ``coupled``
    the mismatch k3 is 1 + 3 x staleness times its fresh level (else independent of it)."""
    rng = np.random.default_rng(2)
    records = healthy_trace()
    for r in records:
        stale = float(rng.integers(0, 4))
        r["async/staleness_mean"] = stale
        r["async/staleness_max"] = stale + 1.0
        if coupled:
            r["mismatch/k3"] = 2e-3 * (1 + 3 * stale) * (1 + rng.normal(0, 0.1))
    return records


def routing_mismatch_trace(level: float = 0.2, layers: int = 8) -> list[dict]:
    """An MoE policy whose learner picks other experts than the sampler for ``level`` of
    token-layer choices (the last layer worst)."""
    records = healthy_trace()
    for r in records:
        r["moe/routing_mismatch"] = level
        r["moe/load_max_frac"] = 0.3
        r.update({f"moe/routing_mismatch/layer{i}": level * (0.5 + i / (layers - 1))
                  for i in range(layers)})
    return records


def _env_metrics(records: list[dict]) -> list[dict]:
    for r in records:
        r["env/turns_mean"] = 3.0
    return records


def multi_turn_trace(**levels) -> list[dict]:
    """A healthy multi-turn run (most trajectories end done, few tool errors), with ``levels`` overriding env/*
    metrics from step 0 on (``tool_errors`` may be a function of the step)."""
    records = healthy_trace()
    for r in records:
        r.update({"env/ended/done": 0.9, "env/ended/max_turns": 0.05, "env/ended/error": 0.01,
                  "env/ended/timeout": 0.0, "env/ended/malformed": 0.0, "env/ended/context": 0.02,
                  "env/ended/length": 0.02, "env/turns_mean": 3.0, "env/tool_calls": 100.0, "env/tool_errors": 5.0,
                  "env/obs_token_frac": 0.4})
        r.update({k: v(r["step"]) if callable(v) else v for k, v in levels.items()})
    return records


def distill_trace(final_kl: float) -> list[dict]:
    """A healthy run with a teacher: opd/reverse_kl from 2.0 falling toward ``final_kl`` (noisy)."""
    rng = np.random.default_rng(1)
    records = healthy_trace()
    for r in records:
        progress = 1.0 - np.exp(-r["step"] / 15.0)
        r["opd/reverse_kl"] = 2.0 + (final_kl - 2.0) * progress + rng.normal(0, 0.05)
        r["opd/top1_agreement"] = 0.2 + 0.3 * progress
    return records


def all_truncated_trace() -> list[dict]:
    """A healthy run whose every completion is cut from step 50 on."""
    return _set(healthy_trace(), "length/truncated_frac", lambda t: 1.0 if t >= 50 else 0.01)


def sync_gap_trace() -> list[dict]:
    """A healthy bf16 run whose sampler leaves the learner at step 55 (k3 0.2: a stale weight sync)."""
    return _set(healthy_trace(), "mismatch/k3", lambda t: 0.2 if t >= 55 else 2e-4)


CLIP_SETUP = {"loss": "clip", "updates_per_batch": 1, "group_size": 8, "precision": "bf16_mixed", "engine": "hf"}
"""batch_info of a clip loss with one update per batch (what the default config gives), in bf16 (the traces'
sampler/learner gap, k3 2e-4, is a bf16 one)."""

TRACES = {
    "healthy": (healthy_trace, set()),
    "entropy_collapse": (entropy_collapse_trace, {"entropy_collapse"}),
    "length_explosion": (length_explosion_trace, {"length_explosion"}),
    "incorrect_longer": (incorrect_longer_trace, {"incorrect_longer"}),
    "zero_variance": (zero_variance_trace, {"zero_variance"}),
    "mismatch_rising": (mismatch_rising_trace, {"mismatch_rising"}),
    "reward_hacking": (reward_hacking_trace, {"reward_hacking"}),
    "noisy_reward": (noisy_reward_trace, {"noisy_reward"}),
    "nonfinite_updates": (nonfinite_trace, {"nonfinite_updates"}),
    "grad_explosion": (grad_explosion_trace, {"grad_explosion"}),
    "inert_clipping": (inert_clipping_trace, {"inert_clipping"}),
    "zero_advantage": (zero_advantage_trace, {"zero_advantage"}),
    "all_truncated": (all_truncated_trace, {"all_truncated", "length_explosion"}),
    "sync_gap": (sync_gap_trace, {"sync_gap", "mismatch_rising"}),
    "mismatch_with_staleness": (staleness_trace, {"mismatch_with_staleness"}),
    "routing_mismatch": (routing_mismatch_trace, {"routing_mismatch"}),
    "healthy_multi_turn": (multi_turn_trace, set()),
    "turn_limit": (lambda: multi_turn_trace(**{"env/ended/max_turns": 0.7, "env/ended/done": 0.25}), {"turn_limit"}),
    "env_failures": (lambda: multi_turn_trace(**{"env/ended/timeout": 0.15, "env/ended/error": 0.05}),
                     {"env_failures"}),
    "tool_errors": (lambda: multi_turn_trace(**{"env/tool_errors": lambda t: 5.0 + t}), {"tool_errors"}),
    "observation_crowding": (lambda: multi_turn_trace(**{"env/ended/context": 0.3}), {"observation_crowding"}),
    "healthy_distillation": (lambda: distill_trace(0.5), set()),
    "opd_stalled": (lambda: distill_trace(1.95), {"opd_stalled"}),
    # failed games run out of turns: longer wrong trajectories are no length bias there
    "multi_turn_incorrect_longer": (lambda: _env_metrics(incorrect_longer_trace()), set()),
}


def write_run(run_dir: Path, records: list[dict], config: dict | None = None) -> Path:
    """A run directory as the trainer leaves it: metrics.jsonl (+ config.yaml)."""
    import yaml

    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "metrics.jsonl", "w") as f:
        for r in records:
            f.write(json.dumps({k: float(v) if k != "step" else v for k, v in r.items()}) + "\n")
    if config is not None:
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    return run_dir


@pytest.fixture
def traces() -> SimpleNamespace:
    """The trace generators, the expected findings per trace, and ``write_run``."""
    return SimpleNamespace(
        TRACES=TRACES, healthy=healthy_trace, zero_variance=zero_variance_trace,
        nonfinite=nonfinite_trace, entropy_collapse=entropy_collapse_trace,
        inert_clipping=inert_clipping_trace, zero_advantage=zero_advantage_trace,
        staleness=staleness_trace, routing_mismatch=routing_mismatch_trace,
        CLIP_SETUP=CLIP_SETUP, write_run=write_run,
    )
