"""The learner role: scored groups in, optimizer steps, weights out to the rollout engines.

One process is a group of one. With ``learner.data_parallel = N`` rank 0 prepares each batch
exactly as one process does (``logp_old``, ``logp_ref``, advantages, loss masks) and sends
the whole :class:`TrainBatch` to the other ranks; every rank then computes the global loss
mask and norm of each mini-batch (ALGORITHMS.md section 3) - the same on every rank - takes
its share of whole micro-batches, and DDP sums the gradients over the ranks before clipping
(:mod:`grpoplus.distributed.rank_hooks`). Every rank steps the same
optimizer on the same gradient, so the weights stay identical on every rank: rank 0's are
the ones published to the engines and written to checkpoints.

With ``learner.strategy=fsdp2`` every forward is a collective (:mod:`grpoplus.distributed.sharding`):
rank 0 sends the scored groups instead, every rank prepares the whole batch (each scoring 1/N of
its rows in the no-grad passes, gathered) and updates its shards, and publishing gathers the
whole weights from the shards on every rank, rank 0 keeping them in its plain copy of the policy;
a checkpoint holds those weights, every rank's optimizer shards and the sharded reference gathered
whole on rank 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from grpoplus import algo as A
from grpoplus.containers import LearnerTrace, ScoredGroups, TrainBatch, UpdateResult
from grpoplus.distributed.group import RankGroup, RoleError
from grpoplus.distributed.sharding import save_optimizer_shards
from grpoplus.learner import checkpoint as ckpt
from grpoplus.learner.hooks import ONE_PROCESS, UpdateHooks
from grpoplus.learner.prepare import LearnerPlan, prepare
from grpoplus.learner.update import update_policy
from grpoplus.models.memory import give_back_freed_memory
from grpoplus.rollout.weights import InProcess, gather_into


@dataclass
class LearnerParts:
    """What every learner rank holds."""

    model: torch.nn.Module
    ref_model: torch.nn.Module | None  # the reference policy, only when beta > 0
    optimizer: torch.optim.Optimizer
    scheduler: object
    entropy_control: A.EntropyControl  # the entropy bonus's coefficient (identical on every rank)
    mirror: torch.nn.Module | None = None  # fsdp2, rank 0: the plain whole policy engines and checkpoints read
    hooks: UpdateHooks = ONE_PROCESS  # how an update meets the other ranks (grpoplus.distributed.rank_hooks)
    teacher: object | None = None  # on-policy distillation's teacher (grpoplus.teacher), only with learner.teacher

    @property
    def policy(self) -> torch.nn.Module:
        """The plain module that holds the whole policy (what engines sample with and checkpoints write)."""
        return self.mirror if self.mirror is not None else self.model


class RankBuilders(NamedTuple):
    """How a learner rank's own process builds itself; the build layer hands them to the learner roles
    (:mod:`grpoplus.assemble.learner`), which never import it."""

    model: Callable  # (LearnerRolePlan, device or None, rank) -> policy or None, before the rank joins its group
    parts: Callable  # (LearnerRolePlan, policy or None, group or None, reward weights) -> (LearnerParts, LearnerPlan)


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
                                    lambda: learn_step(p, scored, step, self.algo, self.plan))
        batch, entropy, metrics = prepare(scored, p.model, p.ref_model, self.algo, self.plan, p.teacher)
        self._tell("update", (batch, step))
        result = self._guard(lambda: update_step(p, batch, step, self.algo, self.plan))
        return learned(batch, entropy, metrics, result, self.plan)

    def publish(self, version: int) -> None:
        """The policy's weights to every target; later rollouts carry ``version``."""
        weights = self.weights()
        for target in self.targets:
            target.sync_weights(weights, version)

    def weights(self) -> InProcess:
        """The whole policy in this process: a sharded learner's is first gathered into rank 0's plain copy."""
        if self.plan.sharded:
            self._tell("gather_weights", None)
            self._collective("gathering the sharded weights", lambda: gather_into(self.parts.mirror, self.parts.model))
        return InProcess(self.parts.policy)

    def save(self, run_dir: Path, step: int, tokenizer, state: dict, keep: int) -> Path:
        """A checkpoint of the whole weights, optimizer and entropy control (identical on every rank) plus the
        trainer's ``state``; a sharded learner's ranks each write their optimizer shards into it."""
        p = self.parts
        state = {**state, "scheduler": p.scheduler.state_dict(), "entropy_control": p.entropy_control.state_dict()}
        if not self.plan.sharded:
            return ckpt.save_checkpoint(run_dir, step, p.policy, tokenizer, {**state, "optimizer":
                                        p.optimizer.state_dict()}, p.ref_model, keep=keep)

        def write_shards(directory: Path) -> None:
            self._tell("save_shards", str(directory))
            self._collective("writing the optimizer shards", lambda: write_rank_shards(p, directory))
        return ckpt.save_checkpoint(run_dir, step, p.policy, tokenizer, state, keep=keep, write_shards=write_shards)

    def load(self, path: Path) -> dict:
        """Every rank loads the checkpoint at ``path`` (a path every rank can read); returns its trainer state."""
        self._tell("load", str(path))
        if self.group is not None:  # sharded weights and any optimizer shards are read collectively
            return self._collective(f"loading {path}", lambda: load_step(self.parts, path))
        return load_step(self.parts, path)

    def close(self) -> None:
        if self.group is not None:
            if not self._broken:
                self.group.send("stop")
                self.group.stopping()
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


def update_step(parts: LearnerParts, batch: TrainBatch, step: int, algo: A.AlgoConfig, plan: LearnerPlan
                ) -> UpdateResult:
    """One rollout batch's optimizer steps on this rank, then the reference update when it is due; with
    ``plan.release_after_update`` the memory the update freed goes back to the system (run.release_memory)."""
    result = update_policy(parts.model, parts.optimizer, parts.scheduler, batch, algo, plan, parts.entropy_control,
                           first_step=(step - 1) * algo.updates_per_batch, hooks=parts.hooks,
                           teacher=getattr(parts.teacher, "model", None))
    if parts.ref_model is not None and A.should_reset_reference(step, algo.ref_reset_every):
        A.update_reference(parts.ref_model, parts.model, algo.ref_update_alpha, parts.optimizer,
                           algo.ref_reset_optimizer)
    if plan.release_after_update:
        give_back_freed_memory()  # the activations and gradients the update freed, before the next rollout
    return result


def learn_step(parts: LearnerParts, scored: ScoredGroups, step: int, algo: A.AlgoConfig, plan: LearnerPlan
               ) -> UpdateResult:
    """Prepare the whole batch and update, on this rank (a sharded learner's every rank runs this)."""
    batch, entropy, metrics = prepare(scored, parts.model, parts.ref_model, algo, plan, parts.teacher, parts.hooks)
    result = update_step(parts, batch, step, algo, plan)
    return learned(batch, entropy, metrics, result, plan)


def learned(batch: TrainBatch, entropy: torch.Tensor | None, metrics: dict, result: UpdateResult, plan: LearnerPlan
            ) -> UpdateResult:
    """The batch's result as the trainer takes it: preparation's and the update's metrics, the entropy whichever
    measured it, and what the learner made of each row (:class:`LearnerTrace`: pi_old's log-probs from the recompute
    pass or the training forward; none when pi_old is the sampler's). Every tensor on the CPU."""
    metrics.update(result.metrics)
    logp = batch.logp_old if plan.logp_old == "recompute" else result.logp
    trace = LearnerTrace(batch.advantages.cpu(), batch.loss_mask.cpu(), None if logp is None else logp.cpu())
    return UpdateResult(metrics, entropy if entropy is not None else result.entropy, trace=trace)


def load_step(parts: LearnerParts, path: Path) -> dict:
    """Weights, optimizer, scheduler, entropy control and reference from the checkpoint at ``path``;
    returns its trainer state."""
    path = Path(path)
    ckpt.load_weights(parts.model, path)
    state = ckpt.load_state(path)
    ckpt.load_optimizer(parts.model, parts.optimizer, path, state)
    parts.scheduler.load_state_dict(state["scheduler"])
    if "entropy_control" in state:  # checkpoints written before the entropy bonus was wired lack it
        parts.entropy_control.load_state_dict(state["entropy_control"])
    if parts.ref_model is not None:
        ckpt.load_reference(parts.ref_model, path)
    return state


def write_rank_shards(parts: LearnerParts, checkpoint: str | Path) -> None:
    """Every rank of a sharded learner: its optimizer shards into the checkpoint being written, and its part in
    gathering the sharded reference, which rank 0 writes whole."""
    save_optimizer_shards(parts.model, parts.optimizer, ckpt.optimizer_dir(checkpoint))
    if parts.ref_model is not None:
        reference = ckpt.whole_state_on_rank0(parts.ref_model)
        if reference:  # rank 0
            ckpt.save_reference(reference, Path(checkpoint), parts.ref_model)


def follow(parts: LearnerParts, algo: A.AlgoConfig, plan: LearnerPlan, group: RankGroup) -> None:
    """A follower rank (rank > 0): run rank 0's commands until it says stop."""
    handlers = {"update": lambda payload: update_step(parts, *payload, algo, plan),
                "learn": lambda payload: learn_step(parts, *payload, algo, plan),
                "gather_weights": lambda _: gather_into(None, parts.model),
                "save_shards": lambda path: write_rank_shards(parts, path),
                "load": lambda path: load_step(parts, path)}
    while True:
        command, payload = group.receive()
        if command == "stop":
            group.stopping()
            return
        handlers[command](payload)
