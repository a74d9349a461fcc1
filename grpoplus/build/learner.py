"""Learner factories: a learner rank's policy, parts (optimizer, reference, hooks of its placement) and
plan, for the driver's rank 0 and for every other rank's own process alike."""

from __future__ import annotations

import copy

import torch

from grpoplus.algo import EntropyControl
from grpoplus.build.factories import build_optimizer, build_policy, build_process, logp_old_source
from grpoplus.config import Config, build_config
from grpoplus.distributed.learner import LearnerParts, RankBuilders
from grpoplus.learner.checkpointing import require_checkpointable
from grpoplus.learner.precision import lower_frozen_linears
from grpoplus.learner.prepare import LearnerPlan, logp_old_mode
from grpoplus.learner.replay import check_replay
from grpoplus.models.memory import EAGER_TRIM_LAYERS
from grpoplus.teacher import load_teacher


def build_learner_parts(cfg: Config, model: torch.nn.Module, mirror: torch.nn.Module | None = None):
    """The policy with its optimizer and schedule, the frozen reference when beta > 0, and the entropy
    bonus's coefficient, and the teacher of on-policy distillation (loaded here, on every rank, like the
    reference); with ``learner.strategy=fsdp2`` over several ranks the policy is sharded here (rank 0
    passes ``mirror``, its plain copy; the reference stays whole on every rank)."""
    from grpoplus.distributed.sharding import shard

    # With LoRA the reference is the same model with its adapters off (no second copy).
    copied = cfg.algo.beta > 0 and cfg.learner.lora_rank == 0
    ref_model = lower_frozen_linears(copy.deepcopy(model).eval().requires_grad_(False), cfg.learner.precision) \
        if copied else None
    if is_sharded(cfg):
        shard(model, cfg.learner.precision, offload=cfg.learner.cpu_offload)
    optimizer, scheduler = build_optimizer(cfg, model)
    teacher = None if cfg.learner.teacher is None else load_teacher(cfg.learner.teacher, next(model.parameters()).device)
    return LearnerParts(model, ref_model, optimizer, scheduler, EntropyControl.from_config(cfg.algo), mirror,
                        teacher=teacher)


def is_sharded(cfg: Config) -> bool:
    """True when the learner's parameters are sharded over its ranks (learner.strategy=fsdp2, several ranks)."""
    return cfg.learner.strategy == "fsdp2" and cfg.learner.data_parallel > 1


def build_learner_rank_parts(cfg: Config, model: torch.nn.Module, group, rewards: tuple = ()):
    """One learner rank's (parts, plan): every rank starts from rank 0's weights (whatever it loaded
    itself) and takes rank 0's reward weights (GDPO, for a rank that prepares batches); rank 0 of a sharded
    learner keeps a plain copy of the policy for its engines and checkpoints."""
    if group is not None:
        group.broadcast_module(model)
        rewards = group.broadcast_object(rewards)
    mirror = copy.deepcopy(model) if is_sharded(cfg) and (group is None or group.rank == 0) else None
    parts = build_learner_parts(cfg, model, mirror)
    if group is not None:
        parts.hooks = rank_hooks(cfg, parts.model, group)
    return parts, build_learner_plan(cfg, model, rewards)


def rank_hooks(cfg: Config, model: torch.nn.Module, group):
    """How this rank's updates meet the other ranks': DDP (replicate) or the sharded model's collectives."""
    from grpoplus.distributed.placement import ReplicateHooks, ShardHooks

    return ShardHooks(group) if is_sharded(cfg) else ReplicateHooks(group, model)


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
                       sharded=is_sharded(cfg))


def build_rank_model(config: dict, device: str | None = None) -> tuple[Config, torch.nn.Module]:
    """What a learner rank's own process builds before it joins the group: its config and its copy of the
    policy on ``device`` (default: learner.device, as the rank's process sees it; Ray gives an actor its GPU
    as cuda:0)."""
    cfg = build_config(base=config)
    build_process(cfg)
    model, _ = build_policy(cfg, device or ("cuda" if cfg.learner.device.startswith("cuda") else cfg.learner.device))
    return cfg, model


# How a learner rank's process builds itself, handed to the learner roles (roles never import the build layer).
RANK_BUILDERS = RankBuilders(model=build_rank_model, parts=build_learner_rank_parts)
