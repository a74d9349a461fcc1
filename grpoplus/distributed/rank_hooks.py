"""The update hooks of several learner ranks (:class:`grpoplus.learner.hooks.UpdateHooks`), one per strategy.

- ``learner.strategy=replicate``: torch's DistributedDataParallel around the training forward. Every
  rank holds the whole model; each rank accumulates its micro-batches' gradients without
  communicating (``no_sync``) and the last backward sums them over the ranks, bucket by bucket,
  overlapped with the backward. The sum, not DDP's mean: the loss is normalised over the whole
  mini-batch (ALGORITHMS.md section 3), so the ranks' gradients add up to one process's.
- ``learner.strategy=fsdp2``: the model is sharded (:mod:`grpoplus.distributed.sharding`); every
  backward reduce-scatters, so every rank runs as many micro-batches as the busiest one; the no-grad
  passes that prepare a batch are split over the ranks too (each scores 1/N of the rows).

In both, a rank whose share of a mini-batch is short runs stand-ins (a copy of a micro-batch, its
loss times 0): the collectives of a backward need every rank. A peer that dies or stops answering
during an update is a :class:`RoleError` naming the rank and the fix.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager, nullcontext

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from grpoplus.distributed.group import RankGroup
from grpoplus.learner.hooks import UpdateHooks


class RankHooks(UpdateHooks):
    """What every strategy of several ranks shares: whole micro-batches by rank, results gathered in order."""

    def __init__(self, group: RankGroup):
        self.group = group

    def share(self, micro: list) -> tuple[list, list]:
        return self.group.share(micro), []

    @contextmanager
    def backward_scope(self, last: bool):
        with self.group.guarding("the update's gradient collectives"):
            yield

    def gather(self, parts: list, tally):
        parts = self.group.gather(parts)
        if tally is not None:
            tallies = self.group.gather([tally])
            for other in tallies[1:]:
                tallies[0].add_counts(other)
            tally = tallies[0]
        return parts, tally


class LearnerForward(torch.nn.Module):
    """The module DDP wraps: its forward is the learner's training forward ``fn(model, ...)`` (the
    learner calls the model's body and head itself, not the model's ``forward``)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, fn, *args, **kwargs):
        return fn(self.model, *args, **kwargs)


def _summed(process_group, bucket):  # unannotated: DDP checks annotations against its own types
    """DDP communication hook: the ``dist.GradBucket``'s gradients summed over the ranks (DDP's default divides
    by their number); returns the future of the summed flat buffer."""
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


# Buffers are not synchronised in forward (every rank's are equal already; init_sync=False skips the start): torch
# 2.13 names this forward_sync_buffers and warns on broadcast_buffers, which earlier releases (the GPU images) take.
_NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                   if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
                   else {"broadcast_buffers": False})


class ReplicateHooks(RankHooks):
    """``learner.strategy=replicate``: DDP sums the gradients of each rank's last micro-batch backward."""

    def __init__(self, group: RankGroup, model: torch.nn.Module):
        super().__init__(group)
        self.ddp = DistributedDataParallel(LearnerForward(model), init_sync=False, gradient_as_bucket_view=True,
                                           **_NO_BUFFER_SYNC)
        self.ddp.register_comm_hook(None, _summed)

    def share(self, micro: list) -> tuple[list, list]:
        mine, _ = super().share(micro)
        return mine, [] if mine else micro[:1]  # one backward per rank: the one that sums

    def forward(self, fn, model, *args, **kwargs):
        return self.ddp(fn, *args, **kwargs)

    @contextmanager
    def backward_scope(self, last: bool):
        with super().backward_scope(last), (nullcontext() if last else self.ddp.no_sync()):
            yield


class ShardHooks(RankHooks):
    """``learner.strategy=fsdp2``: each backward reduce-scatters, so every rank runs as many as the busiest."""

    def share(self, micro: list) -> tuple[list, list]:
        mine, _ = super().share(micro)
        return mine, [(mine or micro)[0]] * (-(-len(micro) // self.group.world) - len(mine))

    def score(self, fn, rollouts):
        """Each rank scores a contiguous 1/N of the rows, padded to the same count with copies of its last row (so
        that every rank runs the same forwards, each a collective), and the parts are gathered in row order:
        every rank ends with the whole batch's log-probs for 1/N of the work."""
        n, rank, world = rollouts.response_ids.shape[0], self.group.rank, self.group.world
        size = -(-n // world)
        mine = list(range(min(rank * size, n), min((rank + 1) * size, n)))
        rows = mine + [mine[-1] if mine else n - 1] * (size - len(mine))
        with self.group.guarding("the no-grad log-prob passes"):
            out = fn(rollouts.select(torch.tensor(rows)))
        parts = self.group.gather([(len(mine), out)])
        return tuple(None if out[i] is None else torch.cat([theirs[i][:k] for k, theirs in parts])
                     for i in range(len(out)))
