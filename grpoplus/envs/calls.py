"""Environment calls run side by side, each with a deadline, none able to hang the run.

Every call (a ``reset``, ``step`` or ``close`` of one trajectory's environment) starts at once in a daemon thread
of its own; a coroutine (an ``async def`` method) is awaited on one shared event loop. A call still running at its
deadline is a timeout: its thread is abandoned (a daemon: it cannot keep the process from exiting) and its late
answer ignored. :func:`run_all` waits for a whole round; :class:`InFlight` lets the episodes go on without a
straggler, which answers into a later round.
"""

from __future__ import annotations

import asyncio
import inspect
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class Outcome:
    """One call's answer: its value, the exception it raised, or a timeout."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out


class _Loop:
    """One event loop in a daemon thread, started on first use, for environments written with ``async def``."""

    _loop: asyncio.AbstractEventLoop | None = None
    _lock = threading.Lock()

    @classmethod
    def run(cls, coroutine) -> Any:
        with cls._lock:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, name="grpoplus-env-loop", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coroutine, cls._loop).result()


def awaited(value: Any) -> Any:
    """``value``, or what it resolves to when it is awaitable (an ``async def`` method's coroutine)."""
    return _Loop.run(value) if inspect.isawaitable(value) else value


def _call(fn: Callable[[], Any]) -> Any:
    return awaited(fn())


def run_all(calls: list[Callable[[], Any]], timeout_s: float) -> list[Outcome]:
    """Run every call concurrently; each answers within ``timeout_s`` or is a timeout (see the module docstring)."""
    answers: queue.Queue = queue.Queue()

    def worker(i: int, fn: Callable[[], Any]) -> None:
        try:
            answers.put((i, Outcome(value=_call(fn))))
        except BaseException as err:  # noqa: BLE001 - an environment's failure is the trajectory's outcome
            answers.put((i, Outcome(error=err)))

    for i, fn in enumerate(calls):
        threading.Thread(target=worker, args=(i, fn), name=f"grpoplus-env-{i}", daemon=True).start()
    outcomes: list[Outcome | None] = [None] * len(calls)
    deadline = time.monotonic() + timeout_s
    pending = len(calls)
    while pending:
        try:
            i, outcome = answers.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        outcomes[i] = outcome
        pending -= 1
    return [Outcome(timed_out=True) if o is None else o for o in outcomes]


class InFlight:
    """Step calls in flight across rounds, keyed by trajectory: each keeps its own deadline."""

    def __init__(self):
        self.answers: queue.Queue = queue.Queue()
        self.deadlines: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self.deadlines)

    def start(self, key: int, fn: Callable[[], Any], timeout_s: float) -> None:
        self.deadlines[key] = time.monotonic() + timeout_s

        def worker() -> None:
            try:
                self.answers.put((key, Outcome(value=_call(fn))))
            except BaseException as err:  # noqa: BLE001 - an environment's failure is the trajectory's outcome
                self.answers.put((key, Outcome(error=err)))

        threading.Thread(target=worker, name=f"grpoplus-env-{key}", daemon=True).start()

    def wait(self, patience_s: float) -> dict[int, Outcome]:
        """The answers of this round: every call in flight, or once ``patience_s`` has passed with at least one
        answer in, those that answered (the others stay in flight); a call past its deadline is a timeout."""
        start, got = time.monotonic(), {}
        while len(got) < len(self.deadlines):
            now = time.monotonic()
            overdue = [k for k, d in self.deadlines.items() if k not in got and d <= now]
            got.update({k: Outcome(timed_out=True) for k in overdue})
            if got and (len(got) == len(self.deadlines) or now >= start + patience_s):
                break
            limit = min(d for k, d in self.deadlines.items() if k not in got)
            if got:
                limit = min(limit, start + patience_s)
            try:
                key, outcome = self.answers.get(timeout=max(0.0, limit - now))
            except queue.Empty:
                continue
            if key in self.deadlines and key not in got:  # a late answer of a timed-out call is ignored
                got[key] = outcome
        for key in got:
            del self.deadlines[key]
        return got
