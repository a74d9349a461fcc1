"""The learner role: scored groups in, optimizer steps, weights out to the rollout engines.

One process is a group of one. With ``learner.data_parallel = N`` rank 0 prepares each batch
exactly as one process does (``logp_old``, ``logp_ref``, advantages, loss masks) and sends
the whole :class:`TrainBatch` to the other ranks; every rank then computes the global loss
mask and norm of each mini-batch (ALGORITHMS.md section 3) - the same on every rank - takes
its share of whole micro-batches, and the gradients are summed over the ranks before
clipping (:func:`grpoplus.learner.update.optimizer_step`). Every rank steps the same
optimizer on the same gradient, so the weights stay identical on every rank: rank 0's are
the ones published to the engines and written to checkpoints.

With ``learner.strategy=fsdp2`` every forward is a collective (:mod:`grpoplus.distributed.sharding`):
rank 0 sends the scored groups instead, every rank prepares the whole batch and updates its
shards, and publishing or saving gathers the whole weights (and optimizer state) from the
shards on every rank, rank 0 keeping them in its plain copy of the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from grpoplus import algo as A
from grpoplus.containers import ScoredGroups, TrainBatch, UpdateResult
from grpoplus.learner import checkpoint as ckpt
from grpoplus.learner.prepare import LearnerPlan, prepare
from grpoplus.learner.update import update_policy
from grpoplus.models.memory import give_back_freed_memory
from grpoplus.distributed.group import RankGroup, RoleError
from grpoplus.distributed.sharding import full_optimizer_state, load_full_optimizer_state, refresh_mirror


@dataclass
class LearnerParts:
    """What every learner rank holds."""

    model: torch.nn.Module
    ref_model: torch.nn.Module | None  # the reference policy, only when beta > 0
    optimizer: torch.optim.Optimizer
    scheduler: object
    entropy_control: A.EntropyControl  # the entropy bonus's coefficient (identical on every rank)
    mirror: torch.nn.Module | None = None  # fsdp2, rank 0: the plain whole policy engines and checkpoints read

    @property
    def policy(self) -> torch.nn.Module:
        """The plain module that holds the whole policy (what engines sample with and checkpoints write)."""
        return self.mirror if self.mirror is not None else self.model


class Learner:
    """The learner as the trainer sees it: rank 0 of the learner group, or the only rank.

    ``targets`` are the engines (or collectors) that take the policy's weights after each
    update; ``launcher`` owns the other ranks' processes when this process started them.
    """

    def __init__(self, parts: LearnerParts, algo: A.AlgoConfig, plan: LearnerPlan, group: RankGroup | None = None,
                 targets: tuple = (), launcher=None):
        self.parts, self.algo, self.plan, self.group = parts, algo, plan, group
        self.targets, self.launcher = targets, launcher
        self._broken = False  # a collective failed: the other ranks cannot be told to stop cleanly

    def learn(self, scored: ScoredGroups, step: int) -> UpdateResult:
        """Prepare the batch and run every optimizer step of it (on every rank)."""
        p = self.parts
        if self.plan.sharded:  # every forward is a collective: every rank prepares the whole batch
            self._tell("learn", (scored, step))
            return self._collective(f"the sharded update of step {step}",
                                    lambda: learn_step(p, scored, step, self.algo, self.plan, self.group))
        batch, entropy, metrics = prepare(scored, p.model, p.ref_model, self.algo, self.plan)
        self._tell("update", (batch, step))
        result = self._guard(lambda: update_step(p, batch, step, self.algo, self.plan, self.group))
        metrics.update(result.metrics)
        return UpdateResult(metrics, entropy if entropy is not None else result.entropy)

    def publish(self, version: int) -> None:
        """The policy's weights to every target; later rollouts carry ``version``."""
        if self.plan.sharded:
            self._tell("gather_weights", None)
            self._collective("gathering the sharded weights",
                             lambda: refresh_mirror(self.parts.mirror, self.parts.model))
        for target in self.targets:
            target.sync_weights(self.parts.policy, version)

    def save(self, run_dir: Path, step: int, tokenizer, state: dict, keep: int) -> Path:
        """A checkpoint of the whole weights, optimizer and entropy control (identical on every rank) plus the
        trainer's ``state``: the same files whatever the strategy (a sharded learner's are gathered)."""
        p = self.parts
        if self.plan.sharded:
            self._tell("gather_optimizer", None)
            optimizer = self._collective("gathering the sharded optimizer state", lambda: optimizer_state(p, self.plan))
        else:
            optimizer = optimizer_state(p, self.plan)
        state = {**state, "optimizer": optimizer, "scheduler": p.scheduler.state_dict(),
                 "entropy_control": p.entropy_control.state_dict()}
        return ckpt.save_checkpoint(run_dir, step, p.policy, tokenizer, state, p.ref_model, keep=keep)

    def load(self, path: Path) -> dict:
        """Every rank loads the checkpoint at ``path`` (a path every rank can read); returns its trainer state."""
        self._tell("load", str(path))
        if self.plan.sharded:  # the shards are set from the whole tensors: collectives
            return self._collective(f"loading {path}", lambda: load_step(self.parts, path, self.plan))
        return self._guard(lambda: load_step(self.parts, path, self.plan))

    def close(self) -> None:
        if self.group is not None:
            if not self._broken:
                self.group.send("stop")
            self.group.close()
        if self.launcher is not None:
            self.launcher.close()

    def _tell(self, command: str, payload) -> None:
        if self.group is not None:
            self._guard(lambda: self.group.send(command, payload))

    def _collective(self, what: str, fn):
        """``fn``'s collectives on every rank (a sharded learner's): a peer's failure is a RoleError naming ``what``."""
        return self._guard(lambda: self.group.collective(what, fn))

    def _guard(self, fn):
        try:
            return fn()
        except RoleError:
            self._broken = True
            raise


def update_step(parts: LearnerParts, batch: TrainBatch, step: int, algo: A.AlgoConfig, plan: LearnerPlan,
                group: RankGroup | None) -> UpdateResult:
    """One rollout batch's optimizer steps on this rank, then the reference update when it is due; with
    ``plan.release_after_update`` the memory the update freed goes back to the system (run.release_memory)."""
    result = update_policy(parts.model, parts.optimizer, parts.scheduler, batch, algo, plan, parts.entropy_control,
                           first_step=(step - 1) * algo.updates_per_batch, group=group)
    if parts.ref_model is not None and A.should_reset_reference(step, algo.ref_reset_every):
        A.update_reference(parts.ref_model, parts.model, algo.ref_update_alpha, parts.optimizer,
                           algo.ref_reset_optimizer)
    if plan.release_after_update:
        give_back_freed_memory()  # the activations and gradients the update freed, before the next rollout
    return result


def learn_step(parts: LearnerParts, scored: ScoredGroups, step: int, algo: A.AlgoConfig, plan: LearnerPlan,
               group: RankGroup | None) -> UpdateResult:
    """Prepare the whole batch and update, on this rank (a sharded learner's every rank runs this)."""
    batch, entropy, metrics = prepare(scored, parts.model, parts.ref_model, algo, plan)
    result = update_step(parts, batch, step, algo, plan, group)
    metrics.update(result.metrics)
    return UpdateResult(metrics, entropy if entropy is not None else result.entropy)


def trained_names(model: torch.nn.Module) -> list[str]:
    """The names of the parameters the optimizer steps, in its order."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


def optimizer_state(parts: LearnerParts, plan: LearnerPlan) -> dict:
    """The optimizer's state as torch writes it for one process (a sharded learner's is gathered whole:
    every rank calls this)."""
    if not plan.sharded:
        return parts.optimizer.state_dict()
    whole = full_optimizer_state(parts.model, parts.optimizer)  # empty on ranks other than 0
    return ckpt.optimizer_state_by_index(whole, trained_names(parts.model)) if whole else {}


def load_step(parts: LearnerParts, path: Path, plan: LearnerPlan) -> dict:
    """Weights, optimizer, scheduler, entropy control and reference from the checkpoint at ``path``;
    returns its trainer state."""
    path = Path(path)
    ckpt.load_weights(parts.model, path)
    state = ckpt.load_state(path)
    if plan.sharded:
        load_full_optimizer_state(parts.model, parts.optimizer,
                                  ckpt.optimizer_state_by_name(state["optimizer"], trained_names(parts.model)))
    else:
        parts.optimizer.load_state_dict(state["optimizer"])
    parts.scheduler.load_state_dict(state["scheduler"])
    if "entropy_control" in state:  # checkpoints written before the entropy bonus was wired lack it
        parts.entropy_control.load_state_dict(state["entropy_control"])
    if parts.ref_model is not None:
        ckpt.load_reference(parts.ref_model, path)
    return state


def follow(parts: LearnerParts, algo: A.AlgoConfig, plan: LearnerPlan, group: RankGroup) -> None:
    """A follower rank (rank > 0): run rank 0's commands until it says stop."""
    handlers = {"update": lambda payload: update_step(parts, *payload, algo, plan, group),
                "learn": lambda payload: learn_step(parts, *payload, algo, plan, group),
                "gather_weights": lambda _: refresh_mirror(None, parts.model),
                "gather_optimizer": lambda _: optimizer_state(parts, plan),
                "load": lambda path: load_step(parts, path, plan)}
    while True:
        command, payload = group.receive()
        if command == "stop":
            return
        handlers[command](payload)
