"""Scale-out past one process: data-parallel learner ranks, roles on Ray, bounded-staleness rollouts.

The single-process loop stays the reference and the default (``cluster=local``,
``learner.data_parallel=1``, ``rollout.max_staleness=0``). Each module is one role:

- :mod:`~grpoplus.distributed.group`: the torch.distributed group of learner ranks (gloo on
  CPU, NCCL on GPU): work shares, the gradient all-reduce, time limits, errors naming the rank.
- :mod:`~grpoplus.distributed.learner`: the learner role. Rank 0 prepares each batch exactly as
  one process does, hands it to the other ranks, and every rank steps the same optimizer on the
  same summed gradient, so the weights stay identical on every rank.
- :mod:`~grpoplus.distributed.local`: starting the other learner ranks on this machine, or
  joining the ranks torchrun started.
- :mod:`~grpoplus.distributed.staleness`: where each step's rollouts come from: the synchronous
  collection, or collection ahead of the learner by at most ``rollout.max_staleness`` versions.
- :mod:`~grpoplus.distributed.ray_cluster`, :mod:`~grpoplus.distributed.ray_rollout`,
  :mod:`~grpoplus.distributed.ray_learner`, :mod:`~grpoplus.distributed.ray_scoring`: ``cluster=ray``,
  the same roles as Ray actors and tasks.
"""

from grpoplus.distributed.group import RoleError

__all__ = ["RoleError"]
