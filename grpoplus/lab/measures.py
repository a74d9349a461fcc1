"""Measures: one number from one finished run, computed from what the run wrote.

Every measure is registered in ``MEASURES`` with one signature,
``fn(run: LabRun, **params) -> float``, and reads only the run directory (``metrics.jsonl``,
``samples.jsonl``, ``config.yaml``): a verdict is computed from the runs' own records,
never from what a paper reports. A measure that cannot be taken (its metric was never
logged) returns NaN; the verdict then says so.

Windows are fractions of the run's steps: the "head" is the steps ``<= frac * last``, the
"tail" the steps ``>= (1 - frac) * last`` (``last`` = the run's last step). Held-out
``eval/*`` metrics are logged every ``eval_every`` steps, so their tail mean averages the
evaluations in that window (less noisy than the last one alone).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from grpoplus.core.registry import Registry
from grpoplus.core.rundir import RunDir
from grpoplus.metrics.series import Series, Trace

MEASURES: Registry = Registry("lab measure")


@dataclass
class LabRun:
    """One finished run of an experiment: its arm, seed, directory, metric records and config."""

    arm: str
    seed: int
    path: Path
    records: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)

    @cached_property
    def trace(self) -> Trace:
        return Trace(self.records)

    @property
    def last_step(self) -> int:
        return max(int(r["step"]) for r in self.records)

    def samples(self) -> list[dict[str, Any]]:
        """Every line of ``samples.jsonl`` (the completions the run logged, with reward and verdict)."""
        path = RunDir(self.path).samples
        if not path.is_file():
            raise FileNotFoundError(f"{path} does not exist")
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def window(series: Series, last: int, frac: float, tail: bool) -> Series:
    """The finite points of ``series`` in the head (``tail=False``) or tail fraction ``frac`` of ``last`` steps."""
    s = series.finite()
    tol = 1e-9 * max(last, 1)  # (1 - 1/3) * 9 is 6.000000000000001 in floating point: step 6 belongs to the tail
    keep = s.steps >= (1.0 - frac) * last - tol if tail else s.steps <= frac * last + tol
    return Series(s.key, s.steps[keep], s.values[keep])


@MEASURES.register("tail_mean")
def tail_mean(run: LabRun, key: str, frac: float = 1 / 3) -> float:
    """Mean of ``key`` over the last ``frac`` of the run."""
    return window(run.trace.get(key), run.last_step, frac, tail=True).mean()


@MEASURES.register("head_mean")
def head_mean(run: LabRun, key: str, frac: float = 1 / 3) -> float:
    """Mean of ``key`` over the first ``frac`` of the run."""
    return window(run.trace.get(key), run.last_step, frac, tail=False).mean()


@MEASURES.register("tail_over_head")
def tail_over_head(run: LabRun, key: str, frac: float = 1 / 3) -> float:
    """Tail mean over head mean of ``key``: below 1 when it fell (e.g. entropy collapsing)."""
    return _divide(tail_mean(run, key, frac), head_mean(run, key, frac))


@MEASURES.register("tail_ratio")
def tail_ratio(run: LabRun, num: str, den: str, frac: float = 1 / 3) -> float:
    """Tail mean of ``num`` over tail mean of ``den`` (e.g. incorrect over correct response length)."""
    return _divide(tail_mean(run, num, frac), tail_mean(run, den, frac))


@MEASURES.register("ratio_change")
def ratio_change(run: LabRun, num: str, den: str, frac: float = 1 / 3) -> float:
    """How much ``num / den`` (of the window means) grew from the head to the tail of the run."""
    head = _divide(head_mean(run, num, frac), head_mean(run, den, frac))
    return tail_ratio(run, num, den, frac) - head


@MEASURES.register("initial")
def initial(run: LabRun, key: str) -> float:
    """The first finite value of ``key`` (held-out accuracy at step 0)."""
    s = run.trace.get(key).finite()
    return float(s.values[0]) if len(s) else math.nan


@MEASURES.register("tail_minus_initial")
def tail_minus_initial(run: LabRun, key: str, base: str = "eval/accuracy", frac: float = 1 / 3) -> float:
    """Tail mean of ``key`` minus the first value of ``base`` in the same run (e.g. a teacher's share of correct
    samples minus the student's held-out accuracy at step 0: how much stronger the teacher is)."""
    return tail_mean(run, key, frac) - initial(run, base)


@MEASURES.register("gain_per_time")
def gain_per_time(run: LabRun, key: str = "eval/accuracy", per_s: float = 1000.0) -> float:
    """Rise of ``key`` from its first to its last value per ``per_s`` seconds of training
    (``time/elapsed_s`` at that last value): progress per wall-clock second, timings of
    the machine it ran on included."""
    s = run.trace.get(key).finite()
    elapsed = run.trace.get("time/elapsed_s").finite()
    if len(s) < 2 or not len(elapsed):
        return math.nan
    at_end = elapsed.values[elapsed.steps <= s.steps[-1]]
    return _divide((s.values[-1] - s.values[0]) * per_s, float(at_end[-1]) if len(at_end) else math.nan)


@MEASURES.register("adv_rms")
def adv_rms(run: LabRun, low: float = 0.0, high: float = 1.0) -> float:
    """Root-mean-square advantage of the trained responses whose group's solve rate is in
    ``[low, high]``, groups with all-equal rewards left out (their advantage is 0 under every
    estimator). The advantages are recomputed from ``samples.jsonl`` with the run's own
    estimator and eps, so the run must log every trained response (``log_samples`` at least
    ``prompts_per_step * group_size``)."""
    values = []
    for rate, adv in _group_advantages(run):
        if low <= rate <= high:
            values.append(adv)
    if not values:
        return math.nan
    a = np.concatenate(values)
    return float(np.sqrt(np.mean(a**2)))


@MEASURES.register("adv_scale_ratio")
def adv_scale_ratio(run: LabRun, edge: float = 0.25) -> float:
    """RMS advantage of the too-easy and too-hard groups (solve rate ``<= edge`` or ``>= 1 - edge``)
    over that of the others: 1 when every difficulty weighs the same, below 1 when the
    low-spread groups get smaller advantages (Dr. GRPO, arXiv:2503.20783, sec. 3.1)."""
    groups = _group_advantages(run)
    extreme = [a for rate, a in groups if rate <= edge or rate >= 1.0 - edge]
    middle = [a for rate, a in groups if edge < rate < 1.0 - edge]
    if not extreme or not middle:
        return math.nan
    rms = lambda parts: float(np.sqrt(np.mean(np.concatenate(parts) ** 2)))  # noqa: E731
    return _divide(rms(extreme), rms(middle))


def _group_advantages(run: LabRun) -> list[tuple[float, np.ndarray]]:
    """(solve rate, advantages [G]) of every trained group with reward spread, from samples.jsonl.

    The advantages of a step are computed over all its groups at once, as the trainer did
    (batch-whitened estimators see the same batch)."""
    import torch

    from grpoplus.algo import compute_advantages

    algo = run.config.get("algo") or {}
    size = int((run.config.get("rollout") or {}).get("group_size", 0))
    steps: dict[int, dict[int, list[dict]]] = {}
    for row in run.samples():
        steps.setdefault(row["step"], {}).setdefault(row["prompt_index"], []).append(row)
    out = []
    for groups in steps.values():
        if any(len(rows) != size for rows in groups.values()):
            raise ValueError(f"{run.path}: samples.jsonl does not hold whole groups of {size}: run with "
                             "log_samples >= prompts_per_step * group_size to measure advantages")
        rows = [r for members in groups.values() for r in members]
        rewards = torch.tensor([r["reward"] for r in rows], dtype=torch.float64)  # [N]
        group_ids = torch.arange(len(groups)).repeat_interleave(size)  # [N], rows grouped as listed
        adv = compute_advantages(rewards, group_ids, estimator=algo.get("adv_estimator", "grpo"),
                                 eps=algo.get("adv_eps", 1e-6)).numpy()
        for g, members in enumerate(groups.values()):
            r = rewards[g * size:(g + 1) * size]
            if not bool((r == r[0]).all()):
                out.append((float(np.mean([m["correct"] for m in members])), adv[g * size:(g + 1) * size]))
    return out


def _divide(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan
