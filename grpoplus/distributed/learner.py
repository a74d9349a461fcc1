"""The learner role: scored groups in, optimizer steps, weights out to the rollout engines.

One process is a group of one. With ``learner.data_parallel = N`` rank 0 prepares each batch
exactly as one process does (``logp_old``, ``logp_ref``, advantages, loss masks) and sends
the whole :class:`TrainBatch` to the other ranks; every rank then computes the global loss
mask and norm of each mini-batch (ALGORITHMS.md section 3) - the same on every rank - takes
its share of whole micro-batches, and the gradients are summed over the ranks before
clipping (:func:`grpoplus.learner.update.optimizer_step`). Every rank steps the same
optimizer on the same gradient, so the weights stay identical on every rank: rank 0's are
the ones published to the engines and written to checkpoints.
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


@dataclass
class LearnerParts:
    """What every learner rank holds."""

    model: torch.nn.Module
    ref_model: torch.nn.Module | None  # the reference policy, only when beta > 0
    optimizer: torch.optim.Optimizer
    scheduler: object
    entropy_control: A.EntropyControl  # the entropy bonus's coefficient (identical on every rank)


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
        if group is not None:
            self._guard(lambda: start_from_rank0(parts, group))

    def learn(self, scored: ScoredGroups, step: int) -> UpdateResult:
        """Prepare the batch and run every optimizer step of it (on every rank)."""
        p = self.parts
        batch, entropy, metrics = prepare(scored, p.model, p.ref_model, self.algo, self.plan)
        self._tell("update", (batch, step))
        result = self._guard(lambda: update_step(p, batch, step, self.algo, self.plan, self.group))
        metrics.update(result.metrics)
        return UpdateResult(metrics, entropy if entropy is not None else result.entropy)

    def publish(self, version: int) -> None:
        """The policy's weights to every target; later rollouts carry ``version``."""
        for target in self.targets:
            target.sync_weights(self.parts.model, version)

    def save(self, run_dir: Path, step: int, tokenizer, state: dict, keep: int) -> Path:
        """A checkpoint of rank 0's weights, optimizer and entropy control (identical on every rank) plus the
        trainer's ``state``."""
        p = self.parts
        state = {**state, "optimizer": p.optimizer.state_dict(), "scheduler": p.scheduler.state_dict(),
                 "entropy_control": p.entropy_control.state_dict()}
        return ckpt.save_checkpoint(run_dir, step, p.model, tokenizer, state, p.ref_model, keep=keep)

    def load(self, path: Path) -> dict:
        """Every rank loads the checkpoint at ``path`` (a path every rank can read); returns its trainer state."""
        self._tell("load", str(path))
        return load_step(self.parts, path)

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


def load_step(parts: LearnerParts, path: Path) -> dict:
    """Weights, optimizer, scheduler, entropy control and reference from the checkpoint at ``path``;
    returns its trainer state."""
    path = Path(path)
    ckpt.load_weights(parts.model, path)
    state = ckpt.load_state(path)
    parts.optimizer.load_state_dict(state["optimizer"])
    parts.scheduler.load_state_dict(state["scheduler"])
    if "entropy_control" in state:  # checkpoints written before the entropy bonus was wired lack it
        parts.entropy_control.load_state_dict(state["entropy_control"])
    if parts.ref_model is not None:
        ckpt.load_reference(parts.ref_model, path)
    return state


def start_from_rank0(parts: LearnerParts, group: RankGroup) -> None:
    """Every rank starts from rank 0's policy (and reference), whatever it loaded itself."""
    group.broadcast_module(parts.model)
    if parts.ref_model is not None:
        group.broadcast_module(parts.ref_model)


def follow(parts: LearnerParts, algo: A.AlgoConfig, plan: LearnerPlan, group: RankGroup) -> None:
    """A follower rank (rank > 0): run rank 0's commands until it says stop."""
    start_from_rank0(parts, group)
    handlers = {"update": lambda payload: update_step(parts, *payload, algo, plan, group),
                "load": lambda path: load_step(parts, path)}
    while True:
        command, payload = group.receive()
        if command == "stop":
            return
        handlers[command](payload)
