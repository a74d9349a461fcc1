"""Launching the roles where the plan's placement (:mod:`grpoplus.plan.placement`) runs them. Each launch takes the
built policy and hands back the roles the loop uses (the engine evaluation samples with, the collector, the learner,
the Ray connection); the loop's components are wired in :mod:`grpoplus.assemble`, the one module that builds them.

- local: one process, or ``learner.data_parallel`` ranks on this machine (spawned here, or under
  torchrun) with rank 0 in this process;
- ray: rollout workers, the learner ranks and reward scoring as Ray actors and tasks, the driver
  (this process) running the loop.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from grpoplus.assemble.factories import build_collector, build_engine, build_rollout_worker, reward_weights
from grpoplus.assemble.learner import RANK_BUILDERS, build_learner_rank_parts
from grpoplus.data.order import PromptSampler
from grpoplus.plan.run import LearnerRolePlan, RunPlan


@dataclass
class Roles:
    """What a launch hands back to the wiring."""

    engine: object  # the engine held-out evaluation samples with (it also samples the rollouts when synchronous)
    scorer: object
    collector: object  # where each step's rollouts come from (grpoplus.distributed.staleness)
    learner: object  # grpoplus.distributed.learner.Learner, or the Ray learner group
    cluster: object | None = None  # the Ray connection of cluster=ray


@dataclass
class Collection:
    """What every launch's collector is built from (the same local and on Ray)."""

    train: list
    plan: object  # grpoplus.collect.CollectPlan
    sampler: PromptSampler
    generator: torch.Generator


def launch_local(plan: RunPlan, model: torch.nn.Module, tokenizer, scorer, collection: Collection,
                 replay: bool) -> Roles:
    """One process, or rank 0 of the local learner ranks; ``replay``: the policy is an MoE routed by its sampler."""
    from grpoplus.distributed.learner import Learner

    role, engine_plan = plan.learner, plan.rollout.engine
    group, launcher = start_learner_group(role)
    try:
        parts, update = build_learner_rank_parts(role, model, group, reward_weights(scorer.pipeline.components))
        policy = parts.policy  # a plain module holding the whole policy: what the engines sample with
        engine = build_engine(engine_plan, policy, tokenizer, role.process.seed, record_routing=replay)
        if plan.collection.max_staleness == 0:  # the synchronous loop: the engine samples with the learner's weights
            collector = _collector(plan, engine, scorer, collection)
            targets = (engine,)
        else:  # sampling runs ahead of the learner on its own copy of the policy
            from grpoplus.distributed.staleness import SnapshotEngine

            sampling = SnapshotEngine(build_engine(engine_plan, copy.deepcopy(policy), tokenizer, role.process.seed,
                                                   record_routing=replay))
            collector = _collector(plan, sampling, scorer, collection)
            targets = (engine, collector)
    except BaseException:
        if launcher is not None:
            launcher.close()
        raise
    return Roles(engine, scorer, collector, Learner(parts, role.algo, update, group, targets, launcher=launcher))


def start_learner_group(role: LearnerRolePlan):
    """(group, launcher): None, None for one learner rank; else this process joins as rank 0 of
    ``learner.data_parallel`` ranks on this machine (started here: the launcher) or under torchrun."""
    from grpoplus.distributed.group import RankGroup
    from grpoplus.distributed.local import start_ranks

    if role.ranks == 1:
        return None, None
    rendezvous, ranks = start_ranks(role, RANK_BUILDERS)
    try:
        group = RankGroup.join(rendezvous)
    except BaseException:
        if ranks is not None:
            ranks.close()
        raise
    if ranks is not None:
        group.describe_peers = ranks.describe
    return group, ranks


def launch_on_ray(plan: RunPlan, task, model: torch.nn.Module, tokenizer, collection: Collection) -> Roles:
    """cluster=ray: rollout workers, the learner group and reward scoring as Ray actors and tasks."""
    import ray

    from grpoplus.assemble.factories import reward_components
    from grpoplus.distributed.ray_cluster import Cluster
    from grpoplus.distributed.ray_learner import RayLearnerGroup
    from grpoplus.distributed.ray_rollout import RayRolloutEngine
    from grpoplus.distributed.ray_scoring import RayScorer
    from grpoplus.rollout.weights import ObjectStore, cpu_state_dict

    rc, ranks, rewards = plan.cluster, plan.placement.ranks, plan.rewards
    cluster = Cluster(rc.address, rc.num_cpus, rc.timeout_s)
    gpu = plan.placement.on_gpus
    cluster.require_gpus(gpu * (rc.rollout_workers + ranks),
                         f"rollout.workers={rc.rollout_workers} and learner.data_parallel={ranks}")
    weights = ray.put(cpu_state_dict(model))
    engine = RayRolloutEngine(plan.rollout, ObjectStore(weights), rc.rollout_workers, rc.engine, tokenizer.pad_token_id,
                              build_rollout_worker, seed=plan.rollout.process.seed, gpu=gpu, max_restarts=rc.max_restarts,
                              timeout_s=rc.engine_timeout_s, start_timeout_s=rc.timeout_s,
                              collective=rc.weight_sync == "collective")
    components = reward_components(rewards, task)
    scorer = RayScorer(components, collection.train, rewards.workers, rewards.timeout_s, rc.timeout_s)
    collector = _collector(plan, engine, scorer, collection)
    targets = (engine,) if plan.collection.max_staleness == 0 else (collector,)
    learner = RayLearnerGroup(plan.learner, weights, ranks, targets, reward_weights(components), RANK_BUILDERS,
                              gpu=gpu, timeout_s=rc.timeout_s)
    if rc.weight_sync == "collective":
        learner.form_weight_sync(engine.actors, plan.learner.collective_timeout_s)
    return Roles(engine, scorer, collector, learner, cluster)


def _collector(plan: RunPlan, engine, scorer, c: Collection):
    return build_collector(plan.collection.max_staleness, engine, c.sampler, c.train, scorer, c.plan, c.generator)
