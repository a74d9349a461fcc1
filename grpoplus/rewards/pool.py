"""A process pool whose hung workers are killed and replaced.

``concurrent.futures.ProcessPoolExecutor`` cannot kill one stuck worker (a timed-out
future keeps its process busy forever), so this pool owns its workers directly: one
``spawn`` process and one pipe each. A call that runs past ``timeout_s`` gets its worker
SIGKILLed; a replacement starts at once and takes work when it reports ready.

Functions travel once per worker, as a pickle (module-level functions and picklable
objects) or as an import spec (``"path/to/file.py:fn"``) re-imported by the worker.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait

from grpoplus.rewards import events


@dataclass
class Call:
    """One call of registered function ``key`` on a slice of the batch."""

    key: str
    args: tuple
    kwargs: dict


def _resolve(payload: tuple):
    kind, value = payload
    if kind == "pickle":
        return pickle.loads(value)
    from grpoplus.core.registry import import_object

    return import_object(value)


def _worker_main(conn) -> None:  # pragma: no cover - runs in the worker process
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    functions = {}
    conn.send(("ready", None, {}))
    while True:
        message = conn.recv()
        if message is None:
            return
        if message[0] == "define":
            try:  # a reward that cannot be loaded here fails each of its calls with the reason
                functions[message[1]] = _resolve(message[2])
            except Exception as err:  # noqa: BLE001
                functions[message[1]] = err
            continue
        call: Call = message[1]
        before = events.snapshot()
        try:  # the worker boundary: report, never die
            fn = functions[call.key]
            if isinstance(fn, Exception):
                raise RuntimeError(f"the reward cannot be loaded in a worker process: {fn}")
            values = fn(*call.args, **call.kwargs)
            conn.send(("ok", list(values) if not isinstance(values, list) else values,
                       events.delta(before, events.snapshot())))
        except Exception as err:  # noqa: BLE001
            conn.send(("error", f"{type(err).__name__}: {err}", events.delta(before, events.snapshot())))


class _Worker:
    def __init__(self, ctx):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.ready = False
        self.defined: set[str] = set()
        self.job: int | None = None
        self.deadline = 0.0

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join()
        self.conn.close()


class KillablePool:
    """``n`` spawn workers; :meth:`run` maps calls with a per-call timeout."""

    def __init__(self, n: int, payloads: dict[str, tuple]):
        if n < 1:
            raise ValueError(f"pool size must be >= 1, got {n}")
        self._ctx = mp.get_context("spawn")
        self._payloads = payloads
        self._workers = [_Worker(self._ctx) for _ in range(n)]

    def run(self, calls: list[Call], timeout_s: float) -> list[tuple[str, object, dict]]:
        """Outcome per call: ``("ok", values, events)``, ``("error", message, events)``, ``("timeout", None, {})``."""
        outcomes: list = [None] * len(calls)
        todo = deque(range(len(calls)))
        while todo or any(w.job is not None for w in self._workers):
            for worker in self._workers:
                if worker.ready and worker.job is None and todo:
                    self._dispatch(worker, calls, todo.popleft(), timeout_s)
            self._collect(outcomes)
        return outcomes

    def _dispatch(self, worker: _Worker, calls: list[Call], index: int, timeout_s: float) -> None:
        call = calls[index]
        if call.key not in worker.defined:
            worker.conn.send(("define", call.key, self._payloads[call.key]))
            worker.defined.add(call.key)
        worker.conn.send(("call", call))
        worker.job, worker.deadline = index, time.monotonic() + timeout_s

    def _collect(self, outcomes: list) -> None:
        busy = [w for w in self._workers if w.job is not None]
        deadlines = [w.deadline for w in busy]
        wait_s = max(0.0, min(deadlines) - time.monotonic()) if deadlines else 0.5
        ready = wait([w.conn for w in self._workers], timeout=wait_s)
        for i, worker in enumerate(self._workers):
            if worker.conn in ready:
                try:
                    status, value, delta = worker.conn.recv()
                except EOFError:  # the worker died (e.g. a segfault in a C extension)
                    if worker.job is not None:
                        outcomes[worker.job] = ("error", "the reward worker process died", {})
                    self._replace(i)
                    continue
                if status == "ready":
                    worker.ready = True
                else:
                    outcomes[worker.job] = (status, value, delta)
                    worker.job = None
            elif worker.job is not None and time.monotonic() >= worker.deadline:
                outcomes[worker.job] = ("timeout", None, {})
                self._replace(i)

    def _replace(self, i: int) -> None:
        self._workers[i].kill()
        self._workers[i] = _Worker(self._ctx)

    def close(self) -> None:
        for worker in self._workers:
            if worker.proc.is_alive() and worker.job is None:
                try:
                    worker.conn.send(None)
                except (BrokenPipeError, OSError):
                    pass
            worker.kill()
        self._workers = []
