"""The learner group on Ray: N actors, one learner rank each, joined in one torch.distributed group.

Rank 0 runs the same :class:`~grpoplus.distributed.learner.Learner` as a local run (it prepares
the batch, sends it to the other ranks, updates, writes checkpoints) and is placed on the
driver's node, so the run directory it writes is the driver's; ranks 1..N-1 run
:func:`~grpoplus.distributed.learner.follow`. After each update rank 0's weights go to the
rollout workers: through the object store (a state dict of CPU tensors), or with
``ray.weight_sync=collective`` by broadcast in a group of their own
(:mod:`~grpoplus.distributed.weight_sync`).
"""

from __future__ import annotations

from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from grpoplus.containers import ScoredGroups, UpdateResult
from grpoplus.distributed.group import RankGroup, Rendezvous, free_port
from grpoplus.distributed.learner import Learner, RankBuilders, follow
from grpoplus.distributed.ray_cluster import role_resources, wait
from grpoplus.distributed.weight_sync import Broadcast, WeightGroup
from grpoplus.plan.run import LearnerRolePlan
from grpoplus.rollout.weights import Collective, ObjectStore, cpu_state_dict


@ray.remote
class LearnerRank:
    """One learner rank: its parts, and (rank 0) the learner the driver calls."""

    def __init__(self, role: LearnerRolePlan, weights: dict | None, rank: int, world: int, rewards: tuple,
                 builders: RankBuilders):
        # Ray gives the actor its GPU as cuda:0; a sharded learner's ranks but 0 take only their shards, in join
        self.role, self.model = role, builders.model(role, None, rank)
        if weights is not None:
            self.model.load_state_dict(weights)
        self.device = role.process.own_device
        self.rank, self.world, self.rewards, self.builders, self.learner = rank, world, rewards, builders, None

    def address(self) -> str:
        return f"tcp://{ray.util.get_node_ip_address()}:{free_port()}"

    def join(self, init_method: str) -> None:
        """Join the learner group, then build this rank's parts in it (a sharded policy is sharded over it)."""
        group = None
        if self.world > 1:
            group = RankGroup.join(Rendezvous(init_method, self.rank, self.world, self.device,
                                              self.role.collective_timeout_s))
        self.parts, self.plan = self.builders.parts(self.role, self.model, group, self.rewards)
        if self.rank == 0:
            self.learner = Learner(self.parts, self.role.algo, self.plan, group)
        else:
            self.group = group

    def follow(self) -> None:
        try:
            follow(self.parts, self.role.algo, self.plan, self.group)
        finally:
            self.group.close()

    def learn(self, scored: ScoredGroups, step: int) -> UpdateResult:
        return self.learner.learn(scored, step)

    def join_weight_sync(self, address: str, world: int, timeout_s: float) -> None:
        self.weights_out = WeightGroup.join(address, 0, world, self.parts.policy, timeout_s, "learner rank 0",
                                            self.device)

    def send_weights(self) -> None:
        self.weights_out.broadcast(self.learner.weights().module)

    def weights(self) -> dict:
        return cpu_state_dict(self.learner.weights())

    def save(self, run_dir: str, step: int, tokenizer, state: dict, keep: int) -> str:
        return str(self.learner.save(Path(run_dir), step, tokenizer, state, keep))

    def load(self, path: str) -> dict:
        return self.learner.load(Path(path))

    def close(self) -> None:
        self.learner.close()


class RayLearnerGroup:
    """The learner role as the trainer sees it (``learn``, ``publish``, ``save``, ``load``, ``close``),
    over N :class:`LearnerRank` actors."""

    def __init__(self, role: LearnerRolePlan, weights: "ray.ObjectRef", ranks: int, targets: tuple, rewards: tuple,
                 builders: RankBuilders, *, gpu: bool, timeout_s: float):
        self.targets, self.timeout_s = targets, timeout_s
        self.broadcast: Broadcast | None = None  # set by form_weight_sync (ray.weight_sync=collective)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        self.actors = [LearnerRank.options(max_restarts=0, **role_resources(gpu),
                                           scheduling_strategy=here if rank == 0 else "DEFAULT")
                       .remote(role, weights if rank == 0 else None, rank, ranks, rewards, builders)
                       for rank in range(ranks)]  # the other ranks take rank 0's weights when the group forms
        addresses = [actor.address.remote() for actor in self.actors]
        init = [self._wait(ref, rank, "starting (building its model and optimizer)")
                for rank, ref in enumerate(addresses)][0]  # every rank placed and built; rank 0's address
        joins = [actor.join.remote(init) for actor in self.actors]
        self.following = [actor.follow.remote() for actor in self.actors[1:]]  # queued behind their join
        for rank, ref in enumerate(joins):
            self._wait(ref, rank, "joining the learner group")

    def learn(self, scored: ScoredGroups, step: int) -> UpdateResult:
        return self._wait(self.actors[0].learn.remote(scored, step), 0, f"the update of step {step}")

    def form_weight_sync(self, workers: list, collective_timeout_s: float) -> None:
        """From now on rank 0 broadcasts its weights to the rollout ``workers`` (actors) in a group of their own."""
        self.broadcast = Broadcast.form(self.actors[0], workers, collective_timeout_s, self.timeout_s)

    def publish(self, version: int) -> None:
        # rank 0's state dict stays in the object store: the driver never holds the weights
        weights = Collective(self.broadcast) if self.broadcast else ObjectStore(self.actors[0].weights.remote())
        for target in self.targets:
            target.sync_weights(weights, version)

    def save(self, run_dir: Path, step: int, tokenizer, state: dict, keep: int) -> Path:
        return Path(self._wait(self.actors[0].save.remote(str(run_dir), step, tokenizer, state, keep), 0,
                               f"writing the checkpoint of step {step}"))

    def load(self, path: Path) -> dict:
        return self._wait(self.actors[0].load.remote(str(path)), 0, f"loading {path}")

    def close(self) -> None:
        """Stop the ranks (teardown: a rank that already failed has raised its error; none is raised here)."""
        ray.wait([self.actors[0].close.remote(), *self.following], num_returns=len(self.actors),
                 timeout=self.timeout_s)
        for actor in self.actors:
            ray.kill(actor)

    def _wait(self, ref, rank: int, what: str):
        return wait(ref, self.timeout_s, f"learner rank {rank} of {len(self.actors)}", what)
