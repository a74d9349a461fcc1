"""The learner ranks' torch.distributed group: work shares, commands, guarded collectives.

Three process groups, because their waits differ:

- ``compute`` (the default group; gloo on CPU, NCCL on GPU): the gradient collectives and the
  start-up weight broadcast, bounded by ``learner.collective_timeout_s``;
- ``objects`` (gloo; the default group itself on CPU): the pickled payloads of an update (the
  batch, every rank's micro-batch metrics), bounded by the same limit;
- ``control`` (gloo): the command a follower rank waits for between updates, while rank 0
  collects rollouts and evaluates. That wait has no useful bound of its own: every wait of
  rank 0 is bounded (engines, rewards, collectives), and a rank 0 that dies closes its
  connections, which a waiting follower sees at once.

Every collective failure (a peer that died, one that did not answer in time) becomes a
:class:`RoleError` naming the rank, the collective and what to do.
"""

from __future__ import annotations

import datetime
import socket
import sys
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

CONTROL_TIMEOUT_S = 7 * 24 * 3600.0
_TEARDOWN = {"stalled": False}
RESUME_HINT = ("the run directory keeps its last complete checkpoint: continue with "
               "`grpoplus train --resume RUN`")


class RoleError(RuntimeError):
    """A role of a distributed run (a learner rank, a rollout worker, the cluster) failed or did not
    answer in time; the message names the role and what to do."""


@dataclass(frozen=True)
class Rendezvous:
    """Where and how one learner rank joins its group."""

    init_method: str  # "tcp://host:port" of rank 0, or "env://" (torchrun sets MASTER_ADDR/PORT, RANK, WORLD_SIZE)
    rank: int
    world: int
    device: str  # "cpu" or "cuda:<local index>"
    timeout_s: float  # joining and every collective of an update

    @property
    def backend(self) -> str:
        return "nccl" if self.device.startswith("cuda") else "gloo"


def free_port() -> int:
    """A TCP port free on this host now (for rank 0's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class RankGroup:
    """One learner rank's view of the group. Build it with :meth:`join` on every rank."""

    def __init__(self, rank: int, world: int, device: str, timeout_s: float, objects, control):
        self.rank, self.world, self.device, self.timeout_s = rank, world, torch.device(device), timeout_s
        self.objects, self.control = objects, control
        self.describe_peers: Callable[[], str] = lambda: ""  # set by a launcher that can see the other ranks

    @classmethod
    def join(cls, rdv: Rendezvous) -> "RankGroup":
        """Join the group (every rank calls this); a rank that does not join in time is an error."""
        timeout = datetime.timedelta(seconds=rdv.timeout_s)
        # NCCL works on the current device: this rank's GPU, not GPU 0 for every rank ("cuda" without an index, a
        # Ray actor's one GPU, is the current device already; torch.cuda.set_device refuses it)
        device = torch.device(rdv.device)
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device)
        try:
            dist.init_process_group(rdv.backend, init_method=rdv.init_method, rank=rdv.rank, world_size=rdv.world,
                                    timeout=timeout)
            objects = None if rdv.backend == "gloo" else dist.new_group(backend="gloo", timeout=timeout)
            control = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=CONTROL_TIMEOUT_S))
        except (RuntimeError, ValueError) as err:
            raise RoleError(f"learner rank {rdv.rank} of {rdv.world}: the group did not form within "
                            f"{rdv.timeout_s:.0f} s at {rdv.init_method} ({first_line(err)}); check that every "
                            "rank started and can reach rank 0's address, or raise learner.collective_timeout_s"
                            ) from err
        return cls(rdv.rank, rdv.world, rdv.device, rdv.timeout_s, objects, control)

    def share(self, items: list) -> list:
        """This rank's contiguous block of ``items`` (whole micro-batches); blocks differ by at most one item."""
        block = torch.tensor_split(torch.arange(len(items)), self.world)[self.rank]
        return [items[i] for i in block.tolist()]

    def gather(self, items: list) -> list:
        """Every rank's ``items``, concatenated in rank order (the order one process would have made them)."""
        out: list = [None] * self.world
        items = _on_cpu(items)  # pickled tensors keep their device: a GPU tensor would land on the peer's GPU
        self._call("gathering the micro-batch results", lambda: dist.all_gather_object(out, items, group=self.objects))
        return [item for part in out for item in part]

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers on every rank (once, when the group starts)."""
        for tensor in [*module.parameters(), *module.buffers()]:
            self._call("the start-up weight broadcast", lambda t=tensor: dist.broadcast(t.data, src=0))

    def broadcast_object(self, obj):
        """Rank 0's ``obj`` on every rank (a small picklable value)."""
        box = [obj]
        self._call("the start-up broadcast", lambda: dist.broadcast_object_list(box, src=0, group=self.objects))
        return box[0]

    def send(self, command: str, payload=None) -> None:
        """Rank 0: a command to every other rank (the payload goes on the time-limited objects group)."""
        self._call(f"sending {command!r} to the other ranks",
                   lambda: dist.broadcast_object_list([command], src=0, group=self.control))
        self._call(f"sending the {command!r} payload", lambda: dist.broadcast_object_list([payload], src=0,
                                                                                          group=self.objects))

    def receive(self) -> tuple[str, object]:
        """A follower rank: wait for rank 0's next command and its payload."""
        box, payload = [None], [None]
        self._call("waiting for rank 0's next command",
                   lambda: dist.broadcast_object_list(box, src=0, group=self.control))
        self._call(f"receiving the {box[0]!r} payload", lambda: dist.broadcast_object_list(payload, src=0,
                                                                                           group=self.objects))
        return box[0], payload[0]

    def collective(self, what: str, fn):
        """Run ``fn``, whose torch collectives run on the default group (a sharded model's update, its
        weights gathered): a peer that died or did not answer in time is a :class:`RoleError`."""
        return self._call(what, fn)

    @contextmanager
    def guarding(self, what: str):
        """The block's collectives (an update's backward) as :meth:`collective` guards ``fn``'s."""
        try:
            yield
        except RuntimeError as err:
            raise self._failure(what, err) from err

    def stopping(self) -> None:
        """Every rank at the end of its last update before any tears the group down (rank 0 after sending
        ``stop``, each follower on receiving it): a bounded barrier, so no rank destroys its connections while a
        peer still reads from them."""
        self._call("the closing barrier", lambda: dist.barrier(group=self.objects))

    def close(self, timeout_s: float = 30.0) -> None:
        """Destroy the process group, within ``timeout_s``: ``destroy_process_group`` can hang now and then when the
        run is over (pytorch#75097; seen in CI runs here: the checkpoint written, one rank never exited), so it runs in
        a daemon thread; a rank that waits longer says so, and :func:`teardown_stalled` tells the process's entry
        point to exit without the interpreter's finalization (which can wait on the stuck teardown in turn)."""
        if not dist.is_initialized():
            return
        done = threading.Event()

        def destroy() -> None:
            dist.destroy_process_group()
            done.set()

        threading.Thread(target=destroy, name="grpoplus-destroy-group", daemon=True).start()
        if not done.wait(timeout_s):
            _TEARDOWN["stalled"] = True
            print(f"grpoplus learner rank {self.rank}: note: torch.distributed.destroy_process_group did not return "
                  f"within {timeout_s:.0f} s after the run; exiting without it", file=sys.stderr)

    def _call(self, what: str, fn):
        try:
            return fn()
        except RuntimeError as err:  # gloo/NCCL: a peer closed its connection, or the time limit passed
            raise self._failure(what, err) from err

    def _failure(self, what: str, err: RuntimeError) -> RoleError:
        peers = self.describe_peers()
        return RoleError(f"learner rank {self.rank} of {self.world}: {what} failed ({first_line(err)}; time "
                         f"limit {self.timeout_s:.0f} s, learner.collective_timeout_s){'; ' + peers if peers else ''}"
                         f"; another learner rank died or stopped answering (see its log); {RESUME_HINT}")


def teardown_stalled() -> bool:
    """True once a process group's teardown in this process did not finish in time (:meth:`RankGroup.close`): the
    process should end with ``os._exit`` after flushing its output."""
    return _TEARDOWN["stalled"]


def _on_cpu(obj):
    """``obj`` with every tensor inside lists, tuples and dicts moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, (list, tuple)):
        return type(obj)(_on_cpu(x) for x in obj)
    if isinstance(obj, dict):
        return {k: _on_cpu(v) for k, v in obj.items()}
    return obj


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"[:300]
