"""Weights from learner rank 0 to the rollout workers by a collective (``ray.weight_sync=collective``).

Learner rank 0 (the sender, rank 0 here) and the K rollout workers (ranks 1..K) form one
torch.distributed process group of their own, once at start: its own TCP store on a port
chosen free on rank 0's node, gloo on CPU and NCCL on GPUs, apart from the learner ranks'
default group (:mod:`~grpoplus.distributed.group`). Each sync broadcasts every parameter
and buffer of the policy in the module's order, packed in buckets of one dtype, and the
workers copy them into their engine's model: bytes are copied, so a worker samples exactly
what it samples after the object-store sync (``ray.weight_sync=object_store``).

Every collective is bounded by ``learner.collective_timeout_s`` and every wait of the driver
by ``ray.timeout_s``: a member that died or never joins is a one-line error naming its role.
The group cannot take in a restarted worker (the others hold connections to the process that
died), so with this sync a rollout worker that dies ends the run with an error naming
``ray.weight_sync=object_store``, whose workers are restarted (``ray.max_restarts``).
"""

from __future__ import annotations

import datetime
import zlib

import torch
import torch.distributed as dist

from grpoplus.distributed.group import RESUME_HINT, RoleError, first_line
from grpoplus.distributed.ray_cluster import RoleDied, wait

FIX = "raise learner.collective_timeout_s, or set ray.weight_sync=object_store"


BUCKET_ELEMENTS = 1 << 24  # elements per broadcast call (64 MiB of float32)


def buckets(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive tensors of one dtype, at most ``BUCKET_ELEMENTS`` per bucket (a larger one alone)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for t in tensors:
        if not out or out[-1][0].dtype != t.dtype or size + t.numel() > BUCKET_ELEMENTS:
            out.append([])
            size = 0
        out[-1].append(t)
        size += t.numel()
    return out


class WeightGroup:
    """One member's side of the weight-sync group; build it with :meth:`join` on every member."""

    def __init__(self, pg, rank: int, timeout_s: float, role: str, device: torch.device):
        self.pg, self.rank, self.timeout_s, self.role, self.device = pg, rank, timeout_s, role, device

    @classmethod
    def join(cls, address: str, rank: int, world: int, module: torch.nn.Module, timeout_s: float,
             role: str, device: str | torch.device | None = None) -> "WeightGroup":
        """Join the group at ``address`` ("tcp://host:port" of rank 0) and check that every member holds
        the same tensors; a member that does not join within ``timeout_s`` is an error. ``device``: where the
        broadcast runs (default: the module's; a sharded learner's rank 0 keeps its whole copy in host memory and
        sends it from its GPU, bucket by bucket)."""
        host, _, port = address.removeprefix("tcp://").rpartition(":")
        timeout = datetime.timedelta(seconds=timeout_s)
        device = torch.device(device) if device is not None else next(module.parameters()).device
        try:
            store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timeout, wait_for_workers=False)
            if device.type == "cuda":
                options = dist.ProcessGroupNCCL.Options()
                options._timeout = timeout
                pg = dist.ProcessGroupNCCL(store, rank, world, options)
            else:
                pg = dist.ProcessGroupGloo(store, rank, world, timeout)
        except (RuntimeError, ValueError) as err:  # the store's wait for rank 0, or the group's for the others
            raise RoleError(f"{role}: the weight-sync group of learner rank 0 and {world - 1} rollout worker(s) "
                            f"did not form within {timeout_s:.0f} s at {address} ({first_line(err)}); check that "
                            f"every role started and can reach learner rank 0's node, {FIX}") from err
        group = cls(pg, rank, timeout_s, role, device)
        group._check_layout(module, device)
        return group

    def broadcast(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers into ``module`` on every member (every member calls this)."""
        tensors = [t.data for t in [*module.parameters(), *module.buffers()]]
        for bucket in buckets(tensors):
            if self.rank == 0:
                flat = torch.cat([t.reshape(-1) for t in bucket]).to(self.device)
            else:
                flat = torch.empty(sum(t.numel() for t in bucket), dtype=bucket[0].dtype, device=self.device)
            self._broadcast(flat, "the weight broadcast")
            if self.rank:
                for t, part in zip(bucket, flat.split([t.numel() for t in bucket])):
                    t.copy_(part.view_as(t))

    def _check_layout(self, module: torch.nn.Module, device: torch.device) -> None:
        """The first collective: every member's tensor names, shapes and dtypes are rank 0's (the buckets of a
        broadcast are cut from them), and every member has joined (NCCL connects at its first collective)."""
        here = torch.tensor(_layout(module), dtype=torch.int64, device=device)
        theirs = here.clone()
        self._broadcast(theirs, "joining the weight-sync group")
        if not torch.equal(here, theirs):
            raise RoleError(f"{self.role}: its policy's tensors differ from learner rank 0's (names, shapes or "
                            "dtypes), so weights cannot be broadcast to it; every role must load the same "
                            "learner.model, or set ray.weight_sync=object_store")

    def _broadcast(self, tensor: torch.Tensor, what: str) -> None:
        options = dist.BroadcastOptions()
        options.rootRank, options.timeout = 0, datetime.timedelta(seconds=self.timeout_s)
        try:
            self.pg.broadcast([tensor], options).wait(options.timeout)
            if tensor.is_cuda:
                torch.cuda.current_stream().synchronize()  # NCCL runs on its stream: wait here, within the limit
        except RuntimeError as err:  # gloo/NCCL: a member closed its connection, or the time limit passed
            raise RoleError(f"{self.role}: {what} failed ({first_line(err)}; time limit {self.timeout_s:.0f} s, "
                            f"learner.collective_timeout_s); another member of the weight-sync group died or "
                            f"stopped answering (see its log); {FIX}; {RESUME_HINT}") from err


class Broadcast:
    """The driver's handle on the group: one sync is learner rank 0's send and every worker's receive.

    Learner targets take it as a :class:`grpoplus.rollout.weights.Collective` source (``sync_weights``).
    """

    def __init__(self, sender, workers: list, wait_s: float):
        self.sender, self.workers, self.wait_s = sender, workers, wait_s

    @classmethod
    def form(cls, sender, workers: list, collective_timeout_s: float, wait_s: float) -> "Broadcast":
        """The group of ``sender`` (learner rank 0's actor) and ``workers`` (rollout worker actors), formed once."""
        group = cls(sender, workers, wait_s)
        address = wait(sender.address.remote(), wait_s, "learner rank 0", "choosing the weight-sync address")
        world = 1 + len(workers)
        joins = [w.join_weight_sync.remote(address, i + 1, world, collective_timeout_s) for i, w in enumerate(workers)]
        group._wait(sender.join_weight_sync.remote(address, world, collective_timeout_s), joins,
                    "joining the weight-sync group")
        return group

    def push(self, version: int) -> None:
        """Learner rank 0's current weights into every worker, which tags later rollouts with ``version``."""
        receives = [w.receive_weights.remote(version) for w in self.workers]
        self._wait(self.sender.send_weights.remote(), receives, f"the weight broadcast of version {version}")

    def _wait(self, sent, received: list, what: str) -> None:
        """The workers first: a worker that died is named at once (the sender only sees a closed connection)."""
        for i, ref in enumerate(received):
            try:
                wait(ref, self.wait_s, f"rollout worker {i}", what)
            except RoleDied as err:
                raise cannot_restart(err) from err.__cause__
        wait(sent, self.wait_s, "learner rank 0", what)


def cannot_restart(err: RoleDied) -> RoleDied:
    """The death of a rollout worker under ``ray.weight_sync=collective``: the run ends, in one line."""
    return err.with_fix("; ray.weight_sync=collective cannot re-form the weight-sync group with a restarted worker: "
                        "set ray.weight_sync=object_store to have dead rollout workers restarted (ray.max_restarts)")


def _layout(module: torch.nn.Module) -> list[int]:
    """(tensor count, element count, CRC-32 of every name, shape and dtype) of what a broadcast sends."""
    named = [*module.named_parameters(), *module.named_buffers()]
    text = repr([(name, tuple(t.shape), str(t.dtype)) for name, t in named])
    return [len(named), sum(t.numel() for _, t in named), zlib.crc32(text.encode())]
