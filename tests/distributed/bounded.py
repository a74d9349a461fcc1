"""A command of a multi-process test (`grpoplus train` with learner ranks, torchrun), run with a time limit that
says where it stuck: past the limit every Python process it started prints each thread's stack (faulthandler, on
SIGABRT), then all are killed and the test fails with their output's tail, instead of a bare TimeoutExpired."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def run_bounded(cmd: list[str], timeout_s: float = 600.0, env: dict | None = None) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True)`` with one OpenMP thread and ``timeout_s``."""
    env = dict(os.environ if env is None else env, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        tree = [*_descendants(proc.pid), proc.pid]
        _signal(tree, signal.SIGABRT)  # each Python process prints its threads' stacks to its stderr
        time.sleep(3)
        _signal(tree, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{' '.join(cmd[:6])} ... did not end within {timeout_s:.0f} s; the stacks of its "
                             f"processes (stderr's end):\n{err[-12000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first found, through /proc), including those in their own sessions."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        children = [p for p, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
