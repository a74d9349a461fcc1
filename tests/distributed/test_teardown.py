"""The end of a distributed run cannot hang it: a process group whose teardown does not return is left behind with
one line, and the process then exits without the interpreter's finalization (which could wait on it forever)."""

import os
import subprocess
import sys
import threading

import torch.distributed as dist

from grpoplus.distributed import group as group_module
from grpoplus.distributed.group import RankGroup, Rendezvous, free_port


def test_a_teardown_that_does_not_return_is_left_behind_with_one_line(monkeypatch, capsys):
    released = threading.Event()
    monkeypatch.setitem(group_module._TEARDOWN, "stalled", False)
    group = RankGroup.join(Rendezvous(f"tcp://127.0.0.1:{free_port()}", 0, 1, "cpu", 30.0))
    real_destroy = dist.destroy_process_group
    monkeypatch.setattr(dist, "destroy_process_group", lambda: released.wait(30) and real_destroy())
    try:
        group.close(timeout_s=0.2)
        assert group_module.teardown_stalled()
        assert "destroy_process_group did not return within 0 s" in capsys.readouterr().err
    finally:
        released.set()  # the stuck teardown now finishes: the next test starts without a group
        for _ in range(300):
            if not dist.is_initialized():
                break
            threading.Event().wait(0.1)
    assert not dist.is_initialized()


def test_the_entry_point_exits_with_the_commands_status_past_a_stuck_teardown():
    """A thread that never ends would keep the interpreter from exiting: after a stalled teardown the entry point
    exits anyway, with the command's status and its output flushed."""
    script = ("import threading, sys\n"
              "from grpoplus.distributed import group\n"
              "group._TEARDOWN['stalled'] = True\n"
              "threading.Thread(target=threading.Event().wait).start()\n"
              "sys.argv = ['grpoplus', 'presets']\n"
              "from grpoplus.entry.cli import entry\n"
              "entry()\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert run.returncode == 0, run.stderr[-2000:]
    assert "grpo" in run.stdout


def test_without_a_stalled_teardown_the_entry_point_exits_as_python_does():
    """The same script without the stall waits for its thread as any Python program does (so the test above
    measures the stall's effect, not an exit that never waits)."""
    script = ("import threading, sys\n"
              "threading.Thread(target=threading.Event().wait).start()\n"
              "sys.argv = ['grpoplus', 'presets']\n"
              "from grpoplus.entry.cli import entry\n"
              "entry()\n")
    try:
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=15,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    except subprocess.TimeoutExpired:
        return
    raise AssertionError("the process exited although a thread was still running")
