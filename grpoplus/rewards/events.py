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


def count_event(name: str, n: int = 1) -> None:
    with _LOCK:
        _COUNTS[name] += n


def snapshot() -> dict[str, int]:
    with _LOCK:
        return dict(_COUNTS)


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
