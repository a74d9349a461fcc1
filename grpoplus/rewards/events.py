"""Process-local counters of reward failures that must not stop a run.

Rewards call :func:`count_event` (``"verifier/timeouts"``, ``"sandbox/timeout"``...);
:class:`~grpoplus.rewards.pipeline.RewardPipeline` takes the difference around each call,
in-process or inside a pool worker, and reports it as ``reward/<name>/<event>``.
"""

from __future__ import annotations

import threading
from collections import Counter

_COUNTS: Counter = Counter()
_LOCK = threading.Lock()


class Unscored(float):
    """A sample's score that could not be computed for a reason that is not the completion's: a verifier that hung or
    crashed, a judge that did not answer. A NaN for a caller doing arithmetic; the reward pipeline leaves the sample
    out of its group's statistics and of the loss (``reward/failed_frac``), as it does a reward that raised, and
    counts it under ``kind`` (``"timeout"`` or ``"error"``) through the events the reward counted."""

    kind: str

    def __new__(cls, kind: str) -> "Unscored":
        if kind not in ("timeout", "error"):
            raise ValueError(f"Unscored kind must be 'timeout' or 'error', got {kind!r}")
        value = super().__new__(cls, "nan")
        value.kind = kind
        return value

    def __reduce__(self):  # a pool worker's value crosses a pipe
        return Unscored, (self.kind,)

    def __repr__(self) -> str:
        return f"Unscored({self.kind!r})"


def count_event(name: str, n: int = 1) -> None:
    with _LOCK:
        _COUNTS[name] += n


def snapshot() -> dict[str, int]:
    with _LOCK:
        return dict(_COUNTS)


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
