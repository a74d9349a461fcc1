"""A math-equivalence checker with a hard time limit that works from any thread.

``math-verify`` guards itself with ``signal.alarm``, which only fires in the main thread
and never inside a C call stuck on a power tower such as ``2^{2^{2^{2^{2^{2}}}}}``. Here
each check runs in a small persistent worker process (``python -m
grpoplus.rewards.verifier``) that speaks one JSON line per request over a pipe. A check
that runs past its deadline gets the worker killed (SIGKILL) and a fresh one started at
once, so the next call finds it (mostly) warm. The common case costs one pipe round trip.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import threading
import time

from grpoplus.rewards.events import Unscored, count_event


class MathVerifier:
    """Thread-safe handle on one killable verification worker.

    ``verify(gold, pred, timeout_s)`` returns True/False, or an :class:`~grpoplus.rewards.events.Unscored` where no
    answer came: a hang (``"timeout"``), a crash of the worker or an exception inside math-verify (``"error"``),
    each counted (``verifier/timeouts``, ``verifier/crashes``, ``verifier/errors``). ``check`` is its boolean
    form (False where there is no answer).
    """

    def __init__(self, start_timeout_s: float = 60.0, command: list[str] | None = None):
        self.start_timeout_s = start_timeout_s
        self.command = command or [sys.executable, "-m", "grpoplus.rewards.verifier"]  # speaks the protocol of _serve
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._ready = False

    def _spawn(self) -> None:
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # a Ctrl-C in the terminal goes to the trainer only
        )
        self._ready = False

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc.stdin.close()
            self._proc.stdout.close()
        self._proc = None

    def _readline(self, deadline: float) -> bytes | None:
        """One reply line, or None past the deadline / when the worker died."""
        fd = self._proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        return self._proc.stdout.readline() or None

    def _ensure_ready(self) -> None:
        if self._proc is None or self._proc.poll() is not None:
            self._kill()
            self._spawn()
        if not self._ready:  # the worker prints one line once math-verify is imported
            line = self._readline(time.monotonic() + self.start_timeout_s)
            if line is None:
                self._kill()
                raise RuntimeError("the math verification worker did not start; is math-verify installed?")
            self._ready = True

    def check(self, gold: str, pred: str, timeout_s: float = 5.0) -> bool:
        return self.verify(gold, pred, timeout_s) is True

    def verify(self, gold: str, pred: str, timeout_s: float = 5.0) -> bool | Unscored:
        with self._lock:
            self._ensure_ready()
            request = json.dumps({"gold": gold, "pred": pred}).encode() + b"\n"
            try:
                self._proc.stdin.write(request)
                self._proc.stdin.flush()
            except BrokenPipeError:
                line = None
            else:
                line = self._readline(time.monotonic() + timeout_s)
            if line is None:
                crashed = self._proc.poll() is not None
                count_event("verifier/crashes" if crashed else "verifier/timeouts")
                self._kill()
                self._spawn()  # warm up the replacement while the caller moves on
                return Unscored("error" if crashed else "timeout")
        reply = json.loads(line)
        if "error" in reply:
            count_event("verifier/errors")
            return Unscored("error")
        return bool(reply.get("equal", False))

    def close(self) -> None:
        with self._lock:
            self._kill()


_DEFAULTS: dict[int, MathVerifier] = {}  # pid -> verifier: a forked child must not share its parent's pipe
_DEFAULT_LOCK = threading.Lock()


def default_verifier() -> MathVerifier:
    """The process-wide verifier (one worker per process; pool workers get their own)."""
    with _DEFAULT_LOCK:
        return _DEFAULTS.setdefault(os.getpid(), MathVerifier())


def _as_latex(answer: str) -> str:
    r"""Wrap an extracted answer so math-verify parses it as one LaTeX expression.

    A bare ``%`` starts a LaTeX comment; escape it so ``50%`` stays fifty percent.
    """
    escaped = "".join("\\%" if ch == "%" and (i == 0 or answer[i - 1] != "\\") else ch for i, ch in enumerate(answer))
    return "\\boxed{" + escaped + "}"


def _serve() -> None:  # pragma: no cover - runs in the worker process
    import ctypes

    ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG=SIGKILL: never outlive the process it serves
    from math_verify import parse, verify

    out = sys.stdout
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        try:  # the worker boundary: any failure of math-verify is one False answer
            gold = parse(_as_latex(request["gold"]), parsing_timeout=None)
            pred = parse(_as_latex(request["pred"]), parsing_timeout=None)
            reply = {"equal": bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=None))}
        except Exception as err:  # noqa: BLE001
            reply = {"equal": False, "error": f"{type(err).__name__}: {err}"[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    _serve()
