"""The certain-failure signals: what one step's metric record shows when that step could not teach the policy, or
when its rollouts were not sampled from the policy that was trained. Each is defined once, here, and read by both
the live health guard (:mod:`grpoplus.metrics.guard`, every step of a run) and the doctor (its checks of the same
codes, over a finished run).

- ``all_truncated``: every completion was cut at ``rollout.max_new_tokens``;
- ``no_spread``: every group's rewards were equal, so every advantage is zero (ALGORITHMS.md section 1);
- ``nonfinite``: every optimizer step of the batch was skipped for a non-finite loss or gradient;
- ``env_failed``: every trajectory of a multi-turn step ended by a failing environment (it raised, hung or answered
  a malformed value), so no trajectory was judged by its environment;
- ``sync_gap``: the engine's log-probs of the tokens it just sampled are further from the learner's than the
  precision allows, on a step whose rollouts were drawn with the current weights: a weight sync that left
  weights stale, or an engine that computes another function.

A signal that means "nothing learned this step" (``no_learning``) counts toward the guard's stop
(``health.stop_after``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

Record = Mapping[str, Any]

SYNC_GAP_BOUNDS = {"fp32": 1e-8, "low": 0.05}
"""Largest ``mismatch/k3`` (KL(sampler || learner) per token, ALGORITHMS.md section 5) of a healthy weight sync.
fp32: the sampler is the learner's function to summation order: the hf engine, or vLLM on a CPU in float32 (measured
3e-14 to 1e-10, docs/results/engines.md and tests/failures/test_sync*.py; one tensor of the nano model one update
behind measured 7e-7). low: bf16 weights or products on either side, TF32, or vLLM on a GPU, whose kernels are its
own (measured 7e-5 to 1e-2). An int8 or fp8 sampler is a different
function (k3 0.56 on SmolLM2): no bound unless ``health.sync_gap_max`` sets one."""


def sync_gap_bound(info: Mapping[str, Any]) -> float | None:
    """The ``mismatch/k3`` bound of a run's precision, engine and sampler weights (``info`` as the doctor's
    batch_info): ``health.sync_gap_max`` where set, else :data:`SYNC_GAP_BOUNDS`'; None: not checked (an int8 or
    fp8 sampler, or a run whose precision is not known). fp32's bound holds for the hf engine, which samples with the
    learner's own kernels, and for vLLM on a CPU (float32, kernels that differ in summation order only); vLLM on a
    GPU, or an engine not named, is held to the low bound."""
    if info.get("sync_gap_max") is not None:
        return float(info["sync_gap_max"])
    quantization = info.get("quantization", "none")
    if "precision" not in info or quantization in ("int8", "fp8"):
        return None
    engine, on_cpu = info.get("engine", "hf"), str(info.get("device", "")).startswith("cpu")
    exact_engine = engine == "hf" or (engine == "vllm" and on_cpu)
    low = info["precision"] != "fp32" or quantization != "none" or info.get("tf32", False) or not exact_engine
    return SYNC_GAP_BOUNDS["low" if low else "fp32"]


def _value(record: Record, key: str) -> float | None:
    value = record.get(key)
    return float(value) if value is not None and math.isfinite(float(value)) else None


@dataclass(frozen=True)
class Signal:
    """One certain-failure signal: whether a step's record shows it, the evidence, and what to change."""

    code: str
    title: str
    fires: Callable[[Record, Mapping[str, Any]], bool]
    evidence: Callable[[Record, Mapping[str, Any]], str]
    fix: str
    no_learning: bool  # a step where it fires teaches the policy nothing

    def line(self, step: int, record: Record, info: Mapping[str, Any]) -> str:
        """The warning printed the step it fires."""
        return f"health: step {step}: {self.code}: {self.title} ({self.evidence(record, info)}) -> fix: {self.fix}"


def _all_truncated(record: Record, info: Mapping) -> bool:
    frac = _value(record, "length/truncated_frac")
    return frac is not None and frac >= 1.0


def _no_spread(record: Record, info: Mapping) -> bool:
    if info.get("teacher"):  # on-policy distillation: the teacher's token advantage is a signal of its own
        return False
    frac = _value(record, "groups/zero_std_frac")
    return frac is not None and frac >= 1.0


def _nonfinite(record: Record, info: Mapping) -> bool:
    skipped = _value(record, "optim/skipped_updates")
    if not skipped or record.get("optim/empty_batch"):  # an empty batch is counted apart (environment errors)
        return False
    return skipped >= info.get("updates_per_batch", 1)


ENV_FAULTS = ("error", "timeout", "malformed")
"""The ways a trajectory ends that are its environment's fault, not the policy's: it raised, did not answer in time,
or answered something that is not a step. Such a trajectory has no score (left out of its group and of the loss)."""
ENV_FAILURES = tuple(f"env/ended/{reason}" for reason in ENV_FAULTS)
"""The shares of trajectories a failing environment ended (the doctor's env_failures check reads the same keys)."""


def _env_failed(record: Record, info: Mapping) -> bool:
    shares = [_value(record, key) for key in ENV_FAILURES]
    return any(v is not None for v in shares) and sum(v or 0.0 for v in shares) >= 1.0 - 1e-9


def _sync_gap(record: Record, info: Mapping) -> bool:
    bound, k3 = sync_gap_bound(info), _value(record, "mismatch/k3")
    if bound is None or k3 is None or (_value(record, "async/staleness_max") or 0) > 0:
        return False  # a batch sampled with older weights on purpose (rollout.max_staleness) differs by design
    return k3 > bound


SIGNALS: tuple[Signal, ...] = (
    Signal("all_truncated", "every completion was cut at the length limit", _all_truncated,
           lambda r, i: f"length/truncated_frac = {float(r['length/truncated_frac']):.2f}",
           "raise rollout.max_new_tokens, or check that the model can end its answer (its chat template and stop "
           "token; data.chat_template)", no_learning=False),
    Signal("no_spread", "every group's rewards were equal: every advantage is zero", _no_spread,
           lambda r, i: f"groups/zero_std_frac = {float(r['groups/zero_std_frac']):.2f}, reward/mean = "
                        f"{float(r.get('reward/mean', math.nan)):.3g}",
           "check the reward on samples.jsonl (constant? the answer format never parses?), use prompts the policy "
           "sometimes solves, a warm start (grpoplus sft), or a larger rollout.group_size", no_learning=True),
    Signal("nonfinite", "every update was skipped: non-finite loss or gradient", _nonfinite,
           lambda r, i: f"optim/skipped_updates = {float(r['optim/skipped_updates']):.0f} of "
                        f"{i.get('updates_per_batch', 1)}",
           "lower algo.lr, keep gradient clipping on, use learner.precision=fp32, and check the rewards for NaN or "
           "huge values", no_learning=True),
    Signal("env_failed", "every trajectory was ended by a failing environment", _env_failed,
           lambda r, i: ", ".join(f"{k} = {float(r[k]):.2f}" for k in ENV_FAILURES if r.get(k)),
           "read the environment's first failure on stderr ('an environment's step ...'); a timeout: raise "
           "rollout.env_timeout_s; malformed: step must return (observation, reward, done, info)", no_learning=True),
    Signal("sync_gap", "the engine's log-probs differ from the learner's right after the weight sync",
           _sync_gap, lambda r, i: f"mismatch/k3 = {float(r['mismatch/k3']):.3g} > {sync_gap_bound(i):.3g} for "
                                   f"{i.get('precision', 'fp32')} with sampler weights {i.get('quantization', 'none')}",
           "a weight sync left the engine's weights stale, or the engine computes another function: check "
           "rollout.engine and ray.weight_sync; for a sampler meant to differ, set health.sync_gap_max",
           no_learning=False),
)

SIGNALS_BY_CODE = {s.code: s for s in SIGNALS}


def fired(record: Record, info: Mapping[str, Any]) -> list[Signal]:
    """The signals a step's record shows."""
    return [s for s in SIGNALS if s.fires(record, info)]


def learns(record: Record, info: Mapping[str, Any]) -> bool:
    """False when the step taught the policy nothing (a ``no_learning`` signal fired)."""
    return not any(s.no_learning for s in fired(record, info))
