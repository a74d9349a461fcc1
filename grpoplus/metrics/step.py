"""Step metrics: one reduction table for every metric, and the rollout statistics of a step.

A step's metrics come from parts: sampling rounds, mini-batches, micro-batches. They are
combined by :func:`reduce_metrics` with one table, by the metric's name: extremes keep
their extreme, event counts add up, everything else is a mean weighted by the part's
size (responses of a round, active tokens of a micro-batch).
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

from grpoplus.algo import group_stats, zero_variance_groups
from grpoplus.containers import ScoredGroups

REDUCTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("_max",), "max"),
    (("_min",), "min"),
    (("errors", "timeouts", "nonfinite", "crashes"), "sum"),  # events: every part's count adds up
)
"""(name suffixes, reduction) in order; a metric matching none is a weighted mean."""


def reduction(key: str) -> str:
    for suffixes, how in REDUCTIONS:
        if key.endswith(suffixes):
            return how
    return "mean"


def reduce_metrics(parts: Iterable[tuple[dict[str, float], float]]) -> dict[str, float]:
    """Combine ``(metrics, weight)`` parts of one step by :data:`REDUCTIONS`.

    A weighted mean over the parts that report the key; a key whose parts all weigh 0 is left out.
    """
    sums: dict[str, float] = {}
    weights: dict[str, float] = {}
    out: dict[str, float] = {}
    for metrics, weight in parts:
        for key, value in metrics.items():
            how = reduction(key)
            if how == "mean":
                sums[key] = sums.get(key, 0.0) + value * weight
                weights[key] = weights.get(key, 0.0) + weight
            elif key not in out:
                out[key] = value
            else:
                out[key] = {"max": max, "min": min, "sum": lambda a, b: a + b}[how](out[key], value)
    out.update({k: sums[k] / weights[k] for k in sums if weights[k] > 0})
    return out


def finite(metrics: dict[str, float]) -> dict[str, float]:
    return {k: v for k, v in metrics.items() if math.isfinite(v)}


def _percentile(values: torch.Tensor, q: float) -> float:
    return float(torch.quantile(values.float(), q)) if values.numel() else 0.0


def rollout_metrics(drawn: list[ScoredGroups], batch: ScoredGroups | None) -> dict[str, float]:
    """Reward, correctness, length and group-spread statistics over every response drawn this step
    (all dynamic-sampling rounds); ``drawn/*`` counts what was sampled, ``batch/*`` what is trained on."""
    rewards = torch.cat([s.rewards[s.scored_mask] for s in drawn])  # a failed response has no score
    correct = torch.cat([s.correct for s in drawn])
    lengths = torch.cat([s.rollouts.lengths for s in drawn]).float()
    finished = torch.cat([s.rollouts.finished for s in drawn])
    out = {"reward/std": float(rewards.std()) if len(rewards) > 1 else 0.0,
           "reward/accuracy": float(correct.float().mean()),
           "length/mean": float(lengths.mean()), "length/max": float(lengths.max()),
           "length/truncated_frac": float((~finished).float().mean()),
           "drawn/responses": float(len(correct)), "drawn/prompts": float(sum(s.num_groups for s in drawn)),
           "batch/responses": float(len(batch.rewards)) if batch else 0.0,
           "batch/prompts": float(batch.num_groups) if batch else 0.0}
    if correct.any():
        out["length/correct_mean"] = float(lengths[correct].mean())
    if (~correct).any():
        out["length/incorrect_mean"] = float(lengths[~correct].mean())
    out.update(_group_spread(drawn))
    if all(s.rollouts.turn_ends is not None for s in drawn):  # multi-turn: turns to solve
        turns = torch.tensor([float(len(t)) for s in drawn for t in s.rollouts.turn_ends])
        if correct.any():
            out["env/turns_correct_mean"] = float(turns[correct].mean())
    return out


def _group_spread(drawn: list[ScoredGroups]) -> dict[str, float]:
    """Zero-spread groups by reward; all-correct / all-wrong groups by the verifier's verdict."""
    groups = zero = all_right = all_wrong = 0
    for s in drawn:
        by_verdict = group_stats(s.correct.float(), s.rollouts.group_ids)
        flat = zero_variance_groups(s.rewards, s.rollouts.group_ids, s.scored)  # under 2 scored: no spread
        groups += by_verdict["groups"]
        zero += len(torch.unique(s.rollouts.group_ids[flat]))
        all_right += by_verdict["all_correct_groups"]
        all_wrong += by_verdict["all_wrong_groups"]
    return {"groups/zero_std_frac": zero / groups, "groups/all_correct_frac": all_right / groups,
            "groups/all_wrong_frac": all_wrong / groups}


def entropy_metrics(entropy: torch.Tensor | None, mask: torch.Tensor) -> dict[str, float]:
    """Mean and low percentiles of the policy's token entropy over the trained response tokens."""
    if entropy is None:
        return {}
    tokens = entropy[mask > 0]
    return {"policy/entropy_mean": float(tokens.mean()) if tokens.numel() else 0.0,
            "policy/entropy_p10": _percentile(tokens, 0.10), "policy/entropy_p25": _percentile(tokens, 0.25)}
