"""Metric records -> numeric series, and the small statistics the doctor and the plots share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np


@dataclass(frozen=True)
class Series:
    """One metric over a run: ``steps[i]`` and ``values[i]`` (float64), in step order."""

    key: str
    steps: np.ndarray  # [n]
    values: np.ndarray  # [n]

    def __len__(self) -> int:
        return len(self.values)

    def finite(self) -> "Series":
        keep = np.isfinite(self.values)
        return Series(self.key, self.steps[keep], self.values[keep])

    def head(self, n: int) -> "Series":
        return Series(self.key, self.steps[:n], self.values[:n])

    def tail(self, n: int) -> "Series":
        return Series(self.key, self.steps[-n:], self.values[-n:])

    def span(self) -> str:
        """Human-readable step range, e.g. ``steps 0-9``."""
        if len(self) == 0:
            return "no steps"
        lo, hi = int(self.steps[0]), int(self.steps[-1])
        return f"step {lo}" if lo == hi else f"steps {lo}-{hi}"

    def mean(self) -> float:
        return float(np.mean(self.values)) if len(self) else math.nan

    def fitted_change(self) -> float:
        """Change of the least-squares line from the first to the last step of the series
        (robust to noise where a last-minus-first difference is not)."""
        if len(self) < 2 or self.steps[-1] == self.steps[0]:
            return 0.0
        slope = np.polyfit(self.steps, self.values, 1)[0]
        return float(slope * (self.steps[-1] - self.steps[0]))


class Trace:
    """Column access to a list of per-step records (a key may be absent from some records)."""

    def __init__(self, records: Sequence[dict[str, Any]]):
        for i, record in enumerate(records):
            if "step" not in record:
                raise ValueError(f"metric record {i} has no 'step' key: {sorted(record)[:5]}")
        self.records = sorted(records, key=lambda r: r["step"])
        self._cache: dict[str, Series] = {}

    def has(self, key: str) -> bool:
        return len(self.get(key)) > 0

    def get(self, key: str) -> Series:
        """All values of ``key`` (non-finite included), with the steps that logged them."""
        if key not in self._cache:
            pairs = [
                (r["step"], _as_float(r[key])) for r in self.records if r.get(key) is not None
            ]
            steps = np.array([p[0] for p in pairs], dtype=np.float64)
            values = np.array([p[1] for p in pairs], dtype=np.float64)
            self._cache[key] = Series(key, steps, values)
        return self._cache[key]

    def first_present(self, *keys: str) -> Series | None:
        """The finite series of the first key that has any finite value, else None."""
        for key in keys:
            series = self.get(key).finite()
            if len(series):
                return series
        return None

    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for record in self.records:
            seen.update(dict.fromkeys(record))
        return list(seen)


def _as_float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"metric value {value!r} is not a number") from None


def ema(values: np.ndarray, alpha: float) -> np.ndarray:
    """Exponential moving average ``s_t = alpha * x_t + (1 - alpha) * s_{t-1}``, ``s_0 = x_0``,
    bias-free at the start; non-finite points are skipped (the average carries over them)."""
    out = np.empty_like(values, dtype=np.float64)  # [n]
    state = math.nan
    for i, x in enumerate(values):
        if math.isfinite(x):
            state = x if math.isnan(state) else alpha * x + (1.0 - alpha) * state
        out[i] = state
    return out


def step_noise(values: np.ndarray) -> float:
    """Step-to-step noise of a series: ``std(diff(x)) / sqrt(2)``, which equals the std of
    independent noise around a slowly moving mean (the trend cancels in the difference)."""
    if len(values) < 3:
        return 0.0
    return float(np.std(np.diff(values), ddof=1) / math.sqrt(2.0))


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 0..n-1 of ``x`` [n], tied values sharing their mean rank."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.arange(len(x), dtype=np.float64)
    _, tie, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.bincount(tie, weights=ranks) / counts)[tie]


def rank_correlation(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation of two series [n] (Pearson's r of their ranks): 1 when
    ``y`` rises with ``x``, whatever the shape; NaN when either is constant."""
    rx, ry = _ranks(x), _ranks(y)
    if len(x) < 3 or rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])
