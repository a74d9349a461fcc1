"""In-process reward calls under a time limit.

A Python thread cannot be stopped, so each call runs in a daemon thread and the caller
waits for it until a deadline: a call still running then is *abandoned* (its result, if
it ever comes, is ignored) and reported as a timeout. ``SIGALRM`` is not used: it fires
in the main thread only, never inside a C call, and math-verify sets its own alarm.

An abandoned call that never returns keeps its thread; :meth:`TimedCalls.hung` counts the
ones still alive, so the pipeline can stop the run before they pile up (a pool, whose hung
workers are killed, is the fix).
"""

from __future__ import annotations

import threading
import time
from typing import Callable

Outcome = tuple[str, object]  # ("ok", value) | ("error", exception) | ("timeout", None)


class TimedCalls:
    """Runs thunks in daemon threads under one deadline and remembers the abandoned ones."""

    def __init__(self) -> None:
        self._abandoned: list[threading.Thread] = []

    def run(self, thunks: list[Callable[[], object]], timeout_s: float, parallel: bool = True) -> list[Outcome]:
        """One outcome per thunk, all within ``timeout_s`` of now. ``parallel``: a thread per thunk (a hung one
        delays no other); else one thread runs them in turn (for a reward that is not thread-safe, e.g. a model
        with its tokenizer), and the ones it has not reached by the deadline are timeouts."""
        outcomes: list[Outcome | None] = [None] * len(thunks)
        stop = threading.Event()
        groups = [[i] for i in range(len(thunks))] if parallel else [list(range(len(thunks)))]
        threads = [threading.Thread(target=_work, args=(thunks, group, outcomes, stop), daemon=True,
                                    name="grpoplus-reward") for group in groups if group]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stop.set()  # a sequential thread past its deadline starts no further thunk
        done = list(outcomes)  # one reading: a thread that finishes from now on is ignored
        self._abandoned.extend(t for t in threads if t.is_alive())
        return [("timeout", None) if outcome is None else outcome for outcome in done]

    def hung(self) -> int:
        """Abandoned calls still running."""
        self._abandoned = [t for t in self._abandoned if t.is_alive()]
        return len(self._abandoned)


def _work(thunks: list, group: list[int], outcomes: list, stop: threading.Event) -> None:
    for i in group:
        if stop.is_set():
            return
        try:  # the thread's boundary: the caller reads the exception
            outcomes[i] = ("ok", thunks[i]())
        except Exception as err:  # noqa: BLE001
            outcomes[i] = ("error", err)
