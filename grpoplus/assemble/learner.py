"""Learner factories: a learner rank's policy, parts (optimizer, reference, the update hooks of its ranks) and
plan, for the driver's rank 0 and for every other rank's own process alike."""

from __future__ import annotations

import copy
import dataclasses
import functools

import torch

from grpoplus.algo import EntropyControl
from grpoplus.assemble.factories import build_optimizer, build_policy, build_process
from grpoplus.distributed.learner import LearnerParts, RankBuilders
from grpoplus.learner.activation_checkpointing import require_checkpointable
from grpoplus.learner.compiling import check_compile
from grpoplus.learner.packing import check_packing, packed_attention
from grpoplus.learner.precision import lower_frozen_linears
from grpoplus.learner.prepare import LearnerPlan
from grpoplus.learner.replay import check_replay
from grpoplus.models.cpu_matmul import route
from grpoplus.models.device import compute_device
from grpoplus.models.freeze import freeze
from grpoplus.models.memory import AUTO_ROWS, auto_token_budget
from grpoplus.models.vision import freeze_vision
from grpoplus.plan.run import LearnerRolePlan
from grpoplus.teacher import load_teacher


def build_learner_parts(role: LearnerRolePlan, model: torch.nn.Module):
    """The policy with its optimizer and schedule, the frozen reference when beta > 0, and the entropy
    bonus's coefficient, and the teacher of on-policy distillation (loaded here, on every rank, like the
    reference)."""
    # With LoRA the reference is the same model with its adapters off (no second copy).
    precision = role.update.precision
    ref_model = lower_frozen_linears(copy.deepcopy(model).eval().requires_grad_(False), precision) \
        if role.reference == "copy" else None
    return _parts(role, model, ref_model)


def build_sharded_parts(role: LearnerRolePlan, whole: torch.nn.Module | None, group) -> LearnerParts:
    """A sharded learner rank's parts (learner.strategy=fsdp2): the policy, and the reference when beta > 0, built
    empty from rank 0's model class and configuration and sharded, each rank taking only its shards from rank 0's
    ``whole`` model (None on the other ranks), which rank 0 keeps as its plain copy for engines and checkpoints."""
    from grpoplus.distributed.sharding import model_spec, sharded_twin

    spec = group.broadcast_object(model_spec(whole) if group.rank == 0 else None)
    twin = functools.partial(sharded_twin, spec, whole, group.device, role.update.precision, role.cpu_offload)
    model = route(twin())  # built from rank 0's spec, multiplied as the model grpoplus loaded (models.cpu_matmul)
    return _parts(role, model, route(twin(frozen=True)) if role.reference != "none" else None, mirror=whole)


def _parts(role: LearnerRolePlan, model: torch.nn.Module, ref_model: torch.nn.Module | None,
           mirror: torch.nn.Module | None = None) -> LearnerParts:
    freeze(model, role.policy.footprint.freeze)  # before the optimizer: frozen parameters get no state
    if not role.policy.footprint.train_vision:
        freeze_vision(model)  # a vision-language policy's vision tower and projector (none in a text model)
    optimizer, scheduler = build_optimizer(role.optimizer, model)
    teacher = None if role.teacher is None else load_teacher(role.teacher, compute_device(model), role.update.precision,
                                                             role.policy.task, role.policy.difficulty)
    return LearnerParts(model, ref_model, optimizer, scheduler, EntropyControl.from_config(role.algo), mirror,
                        teacher=teacher)


def build_learner_rank_parts(role: LearnerRolePlan, model: torch.nn.Module | None, group, rewards: tuple = ()):
    """One learner rank's (parts, plan): every rank starts from rank 0's weights (whatever it loaded
    itself) and takes rank 0's reward weights (GDPO, for a rank that prepares batches). A sharded learner's
    ranks other than 0 pass no ``model``: they never hold it whole (:func:`build_sharded_parts`)."""
    if group is not None:
        rewards = group.broadcast_object(rewards)
    if role.update.sharded:
        parts = build_sharded_parts(role, model, group)
    else:
        if group is not None:
            group.broadcast_module(model)
        parts = build_learner_parts(role, model)
    if group is not None:
        parts.hooks = rank_hooks(role, parts.model, group)
    return parts, build_learner_plan(role, parts.model, rewards)


def rank_hooks(role: LearnerRolePlan, model: torch.nn.Module, group):
    """How this rank's updates meet the other ranks': DDP (replicate) or the sharded model's collectives."""
    from grpoplus.distributed.rank_hooks import ReplicateHooks, ShardHooks

    return ShardHooks(group) if role.update.sharded else ReplicateHooks(group, model)


def build_learner_plan(role: LearnerRolePlan, model: torch.nn.Module, rewards: tuple = ()) -> LearnerPlan:
    """How the learner prepares and updates: the role's update plan, with the policy's MoE routing shape and
    ``rewards``, the reward components' (name, weight), which only the rank that prepares the batch needs (GDPO)."""
    update = role.update
    if update.gradient_checkpointing:
        require_checkpointable(model)
    routing = check_replay(update.routing_replay, model)
    compile_mode = check_compile(update.compile != "off", update.compile, model, routing is not None)
    packing = check_packing(update.packing, model)
    fields = {**dataclasses.asdict(update), "packing": packing, "compile": compile_mode or "off",
              "packed_attention": packed_attention(update.packed_attention, model, packing)}
    row_tokens = fields.pop("row_tokens")
    if update.micro_batch_size == "auto":  # sized now, on the memory left with the model, reference and teacher loaded
        fields.update(micro_batch_size=AUTO_ROWS, micro_batch_tokens=auto_token_budget(
            model, update.precision, update.gradient_checkpointing, row_tokens))
    return LearnerPlan(**fields, seed=role.process.seed, routing_spec=routing, reward_weights=rewards)


def build_rank_model(role: LearnerRolePlan, device: str | None = None, rank: int = 0) -> torch.nn.Module | None:
    """What a learner rank's own process builds before it joins the group: its copy of the policy on ``device``
    (default: the rank's process device; Ray gives an actor its GPU as cuda:0). A sharded learner's ranks other than 0
    load nothing: they take their shards from rank 0; its rank 0 loads the whole policy into host memory when no
    engine samples with it there."""
    build_process(role.process)
    if rank > 0 and role.update.sharded:
        return None
    model, _ = build_policy(role.policy, "cpu" if role.host_copy else device or role.process.own_device,
                            role.process.seed, trains=not role.host_copy)
    return model


# How a learner rank's process builds itself, handed to the learner roles (roles never import the build layer).
RANK_BUILDERS = RankBuilders(model=build_rank_model, parts=build_learner_rank_parts)
