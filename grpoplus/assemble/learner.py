"""Learner factories: a learner rank's policy, parts (optimizer, reference, hooks of its placement) and
plan, for the driver's rank 0 and for every other rank's own process alike."""

from __future__ import annotations

import copy
import functools

import torch

from grpoplus.algo import EntropyControl
from grpoplus.assemble.factories import build_optimizer, build_policy, build_process, logp_old_source
from grpoplus.config import Config, build_config
from grpoplus.distributed.learner import LearnerParts, RankBuilders
from grpoplus.learner.checkpointing import require_checkpointable
from grpoplus.learner.precision import lower_frozen_linears
from grpoplus.learner.prepare import LearnerPlan, logp_old_mode
from grpoplus.learner.replay import check_replay
from grpoplus.models.device import compute_device
from grpoplus.models.memory import EAGER_TRIM_LAYERS
from grpoplus.plan.placement import process_device, whole_copy_in_host_memory
from grpoplus.teacher import load_teacher


def build_learner_parts(cfg: Config, model: torch.nn.Module):
    """The policy with its optimizer and schedule, the frozen reference when beta > 0, and the entropy
    bonus's coefficient, and the teacher of on-policy distillation (loaded here, on every rank, like the
    reference)."""
    # With LoRA the reference is the same model with its adapters off (no second copy).
    copied = cfg.algo.beta > 0 and cfg.learner.lora_rank == 0
    ref_model = lower_frozen_linears(copy.deepcopy(model).eval().requires_grad_(False), cfg.learner.precision) \
        if copied else None
    return _parts(cfg, model, ref_model)


def build_sharded_parts(cfg: Config, whole: torch.nn.Module | None, group) -> LearnerParts:
    """A sharded learner rank's parts (learner.strategy=fsdp2): the policy, and the reference when beta > 0, built
    empty from rank 0's model class and configuration and sharded, each rank taking only its shards from rank 0's
    ``whole`` model (None on the other ranks), which rank 0 keeps as its plain copy for engines and checkpoints."""
    from grpoplus.distributed.sharding import model_spec, sharded_twin

    lrn = cfg.learner
    spec = group.broadcast_object(model_spec(whole) if group.rank == 0 else None)
    twin = functools.partial(sharded_twin, spec, whole, group.device, lrn.precision, lrn.cpu_offload)
    model = twin()
    return _parts(cfg, model, twin(frozen=True) if cfg.algo.beta > 0 else None, mirror=whole)


def _parts(cfg: Config, model: torch.nn.Module, ref_model: torch.nn.Module | None,
           mirror: torch.nn.Module | None = None) -> LearnerParts:
    optimizer, scheduler = build_optimizer(cfg, model)
    lrn = cfg.learner
    teacher = None if lrn.teacher is None else load_teacher(lrn.teacher, compute_device(model), lrn.precision)
    return LearnerParts(model, ref_model, optimizer, scheduler, EntropyControl.from_config(cfg.algo), mirror,
                        teacher=teacher)


def build_learner_rank_parts(cfg: Config, model: torch.nn.Module | None, group, rewards: tuple = ()):
    """One learner rank's (parts, plan): every rank starts from rank 0's weights (whatever it loaded
    itself) and takes rank 0's reward weights (GDPO, for a rank that prepares batches). A sharded learner's
    ranks other than 0 pass no ``model``: they never hold it whole (:func:`build_sharded_parts`)."""
    if group is not None:
        rewards = group.broadcast_object(rewards)
    if cfg.learner.sharded:
        parts = build_sharded_parts(cfg, model, group)
    else:
        if group is not None:
            group.broadcast_module(model)
        parts = build_learner_parts(cfg, model)
    if group is not None:
        parts.hooks = rank_hooks(cfg, parts.model, group)
    return parts, build_learner_plan(cfg, parts.model, rewards)


def rank_hooks(cfg: Config, model: torch.nn.Module, group):
    """How this rank's updates meet the other ranks': DDP (replicate) or the sharded model's collectives."""
    from grpoplus.distributed.placement import ReplicateHooks, ShardHooks

    return ShardHooks(group) if cfg.learner.sharded else ReplicateHooks(group, model)


def build_learner_plan(cfg: Config, model: torch.nn.Module, rewards: tuple = ()) -> LearnerPlan:
    """How the learner prepares and updates; ``rewards``: the reward components' (name, weight), which
    only the rank that prepares the batch needs (GDPO)."""
    lrn = cfg.learner
    if lrn.gradient_checkpointing:
        require_checkpointable(model)
    return LearnerPlan(cfg.rollout.temperature, lrn.micro_batch_size, lrn.max_grad_norm,
                       logp_old_mode(cfg.algo, logp_old_source(cfg), uses_reference=cfg.algo.beta > 0),
                       micro_batch_tokens=lrn.micro_batch_tokens, routing_replay=cfg.algo.routing_replay,
                       routing_spec=check_replay(cfg.algo.routing_replay, model), seed=cfg.run.seed,
                       reward_weights=rewards, reference_adapters_off=lrn.lora_rank > 0 and cfg.algo.beta > 0,
                       share_prompts=lrn.share_prompts, gradient_checkpointing=lrn.gradient_checkpointing,
                       trim_every=EAGER_TRIM_LAYERS if cfg.run.release_memory == "eager" else 0,
                       release_after_update=cfg.run.release_memory != "off", precision=lrn.precision,
                       sharded=cfg.learner.sharded)


def build_rank_model(config: dict, device: str | None = None, rank: int = 0
                     ) -> tuple[Config, torch.nn.Module | None]:
    """What a learner rank's own process builds before it joins the group: its config and its copy of the
    policy on ``device`` (default: learner.device, as the rank's process sees it; Ray gives an actor its GPU
    as cuda:0). A sharded learner's ranks other than 0 load nothing: they take their shards from rank 0; its
    rank 0 loads the whole policy into host memory when no engine samples with it there."""
    cfg = build_config(base=config)
    build_process(cfg)
    if rank > 0 and cfg.learner.sharded:
        return cfg, None
    host = whole_copy_in_host_memory(cfg)
    model, _ = build_policy(cfg, "cpu" if host else device or process_device(cfg), trains=not host)
    return cfg, model


# How a learner rank's process builds itself, handed to the learner roles (roles never import the build layer).
RANK_BUILDERS = RankBuilders(model=build_rank_model, parts=build_learner_rank_parts)
