"""Config -> components: the one place that turns a validated config into objects."""

from __future__ import annotations

import copy
import functools
import math
from dataclasses import dataclass

import torch

from grpoplus.collect import CollectPlan, collect
from grpoplus.config import Config
from grpoplus.containers import SamplingParams
from grpoplus.learner.prepare import LearnerPlan, logp_old_mode
from grpoplus.prompts import PromptSampler
from grpoplus.scoring import Scorer


@dataclass
class Components:
    """Everything a run needs, built once from its config."""

    task: object
    train: list
    test: list
    tokenizer: object
    engine: object  # the engine held-out evaluation samples with (it also samples the rollouts when synchronous)
    scorer: Scorer
    sampler: PromptSampler
    generator: torch.Generator
    collect_plan: CollectPlan
    learner: object  # grpoplus.distributed.learner.Learner, or the Ray learner group
    collector: object  # where each step's rollouts come from (grpoplus.distributed.staleness)
    cluster: object | None = None  # the Ray connection of cluster=ray

    def close(self) -> None:
        self.collector.close()
        self.learner.close()
        self.scorer.close()
        self.engine.close()
        if self.cluster is not None:
            self.cluster.close()


def build_process(cfg: Config) -> None:
    """Settings of every process of a run (the driver, learner ranks, rollout workers)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar: ours
    torch.manual_seed(cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)


def build(cfg: Config) -> Components:
    build_process(cfg)
    task, train, test, model, tokenizer = build_task_and_model(cfg)
    if cfg.run.cluster == "ray":
        return build_on_ray(cfg, task, train, test, model, tokenizer)
    parts = build_learner_parts(cfg, model)
    scorer = Scorer(build_rewards(cfg, task), train)
    engine = build_engine(cfg, model, tokenizer)
    collect_plan = build_collect_plan(cfg, tokenizer)
    sampler, generator = PromptSampler(len(train), cfg.run.seed), torch.Generator().manual_seed(cfg.run.seed)
    if cfg.rollout.max_staleness == 0:  # the synchronous loop: the engine samples with the learner's weights
        collector = build_collector(cfg, engine, sampler, train, scorer, collect_plan, generator)
        targets = (engine,)
    else:  # sampling runs ahead of the learner on its own copy of the policy
        from grpoplus.distributed.staleness import SnapshotEngine

        copy_model = copy.deepcopy(model)
        sampling = SnapshotEngine(build_engine(cfg, copy_model, tokenizer), copy_model)
        collector = build_collector(cfg, sampling, sampler, train, scorer, collect_plan, generator)
        targets = (engine, collector)
    learner = build_local_learner(cfg, parts, targets)
    return Components(task, train, test[: cfg.data.eval_size], tokenizer, engine, scorer, sampler, generator,
                      collect_plan, learner, collector)


def build_collect_plan(cfg: Config, tokenizer) -> CollectPlan:
    params = SamplingParams(n=cfg.rollout.group_size, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_new_tokens=cfg.rollout.max_new_tokens)
    return CollectPlan.from_algo(cfg.algo, params, cfg.rollout.prompts_per_step, tokenizer.pad_token_id)


def build_collector(cfg: Config, engine, sampler: PromptSampler, train: list, scorer, plan: CollectPlan,
                    generator: torch.Generator):
    """Synchronous collection (max_staleness = 0), or collection ahead of the learner by at most K versions."""
    from grpoplus.distributed.staleness import BoundedStaleness, Synchronous

    collect_step = functools.partial(collect, engine, sampler, train, scorer, plan, generator)
    if cfg.rollout.max_staleness == 0:
        return Synchronous(collect_step, sampler, generator)
    return BoundedStaleness(collect_step, engine, sampler, generator, cfg.rollout.max_staleness)


def build_learner_parts(cfg: Config, model: torch.nn.Module):
    """The policy with its optimizer and schedule, and the frozen reference when beta > 0."""
    from grpoplus.distributed.learner import LearnerParts

    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.algo.beta > 0 else None
    optimizer, scheduler = build_optimizer(cfg, model)
    return LearnerParts(model, ref_model, optimizer, scheduler)


def build_learner_plan(cfg: Config) -> LearnerPlan:
    return LearnerPlan(cfg.rollout.temperature, cfg.learner.micro_batch_size, cfg.learner.max_grad_norm,
                       logp_old_mode(cfg.algo, cfg.learner.logp_old, cfg.algo.beta > 0))


def build_local_learner(cfg: Config, parts, targets: tuple):
    """This process as the only learner rank, or as rank 0 of ``learner.data_parallel`` ranks on this
    machine (started here) or under torchrun."""
    from grpoplus.distributed.group import RankGroup
    from grpoplus.distributed.learner import Learner
    from grpoplus.distributed.local import start_ranks

    if cfg.learner.data_parallel == 1:
        return Learner(parts, cfg.algo, build_learner_plan(cfg), targets=targets)
    rendezvous, ranks = start_ranks(cfg)
    try:
        group = RankGroup.join(rendezvous)
        if ranks is not None:
            group.describe_peers = ranks.describe
        return Learner(parts, cfg.algo, build_learner_plan(cfg), group, targets, launcher=ranks)
    except BaseException:
        if ranks is not None:
            ranks.close()
        raise


def build_learner_rank(cfg: Config, device: str):
    """What a follower learner rank builds: its parts and plan (the weights come from rank 0)."""
    build_process(cfg)
    model, _ = build_policy(cfg, device)
    return build_learner_parts(cfg, model), build_learner_plan(cfg)


def build_on_ray(cfg: Config, task, train: list, test: list, model, tokenizer) -> Components:
    """cluster=ray: rollout workers, the learner group and reward scoring as Ray actors and tasks; the
    driver (this process) runs the loop, the collection's bookkeeping and evaluation requests."""
    import ray

    from grpoplus.distributed.ray_cluster import Cluster
    from grpoplus.distributed.ray_learner import RayLearnerGroup
    from grpoplus.distributed.ray_rollout import RayRolloutEngine
    from grpoplus.distributed.ray_scoring import RayScorer

    r, lrn, rc = cfg.rollout, cfg.learner, cfg.ray
    cluster = Cluster(rc.address, rc.num_cpus, rc.timeout_s)
    gpu = lrn.device.startswith("cuda")
    cluster.require_gpus(gpu * (r.workers + lrn.data_parallel),
                         f"rollout.workers={r.workers} and learner.data_parallel={lrn.data_parallel}")
    config, weights = cfg.to_dict(), ray.put({k: v.detach().cpu() for k, v in model.state_dict().items()})
    engine = RayRolloutEngine(config, weights, r.workers, r.engine, tokenizer.pad_token_id, seed=cfg.run.seed,
                              gpu=gpu, max_restarts=rc.max_restarts, timeout_s=r.engine_timeout_s,
                              start_timeout_s=rc.timeout_s)
    scorer = RayScorer(reward_components(cfg, task), train, cfg.data.reward_workers, cfg.data.reward_timeout_s,
                       rc.timeout_s)
    collect_plan = build_collect_plan(cfg, tokenizer)
    sampler, generator = PromptSampler(len(train), cfg.run.seed), torch.Generator().manual_seed(cfg.run.seed)
    collector = build_collector(cfg, engine, sampler, train, scorer, collect_plan, generator)
    targets = (engine,) if r.max_staleness == 0 else (collector,)
    learner = RayLearnerGroup(config, weights, lrn.data_parallel, targets, gpu=gpu, timeout_s=rc.timeout_s)
    return Components(task, train, test[: cfg.data.eval_size], tokenizer, engine, scorer, sampler, generator,
                      collect_plan, learner, collector, cluster)


def build_policy(cfg: Config, device: str | None = None):
    """The policy and its tokenizer, as ``learner.model`` names them, on ``device`` (default learner.device)."""
    from grpoplus.models.load import load_policy

    d = cfg.data
    return load_policy(cfg.learner.model, task=d.task if d.data is None else None, difficulty=d.difficulty,
                       device=device or cfg.learner.device, seed=cfg.run.seed)


def build_task_and_model(cfg: Config):
    """The task (built-in or a data set), its train/test examples, and the policy with its tokenizer."""
    from grpoplus.tasks import get_task
    from grpoplus.tasks.dataset import dataset_task

    d = cfg.data
    builtin = d.data is None
    model, tokenizer = build_policy(cfg, "cpu" if cfg.run.cluster == "ray" else None)  # on Ray: the roles' devices
    if builtin:
        kwargs = {} if d.difficulty is None else {"difficulty": d.difficulty}
        task = get_task(d.task, seed=cfg.run.seed, **kwargs)
    else:
        task = dataset_task(d, tokenizer if d.chat_template else None, seed=cfg.run.seed)
    return task, list(task.split("train")), list(task.split("test")), model, tokenizer


def build_rewards(cfg: Config, task):
    """The reward pipeline of :func:`reward_components`, in-process or with a pool (``data.reward_workers``)."""
    from grpoplus.rewards import RewardPipeline

    return RewardPipeline(reward_components(cfg, task), workers=cfg.data.reward_workers,
                          timeout_s=cfg.data.reward_timeout_s)


def reward_components(cfg: Config, task) -> list:
    """The configured reward components, the task verifier (weight 0 when not listed: accuracy is
    always its verdict), and DAPO's soft overlong punishment when ``overlong_shaping``."""
    from grpoplus.rewards import parse_reward_specs

    specs = list(cfg.data.rewards)
    names = [comp.name for comp in parse_reward_specs(specs, extra={"task": task.reward})]
    if "task" not in names:
        specs.append("task:0")
    if cfg.algo.overlong_shaping:
        if "soft_overlong" in names:
            raise ValueError("algo.overlong_shaping adds the soft_overlong reward itself: drop it from data.rewards "
                             "or set overlong_shaping=false")
        specs.append({"name": "soft_overlong", "kwargs": {"max_len": cfg.algo.max_len, "cache": cfg.algo.cache_len}})
    return parse_reward_specs(specs, extra={"task": task.reward})


def build_engine(cfg: Config, model, tokenizer):
    from grpoplus.rollout import ENGINES, EngineOptions

    r = cfg.rollout
    max_len = getattr(model.config, "max_position_embeddings", None) or 4096
    options = EngineOptions(quantization=r.quantization, max_num_seqs=r.max_num_seqs or None,
                            max_model_len=min(max_len, 8192), seed=cfg.run.seed, start_timeout_s=r.engine_timeout_s,
                            generate_timeout_s=r.engine_timeout_s, extra=dict(r.engine_kwargs))
    return ENGINES.get(r.engine)(model, tokenizer, options)


def build_optimizer(cfg: Config, model):
    """AdamW with linear warm-up then constant / cosine / linear decay (per optimizer step)."""
    lr = cfg.learner
    warmup, schedule = lr.warmup_steps, lr.lr_schedule
    total = cfg.run.max_steps * cfg.algo.updates_per_batch
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr.lr,
                                  weight_decay=lr.weight_decay, betas=(lr.adam_beta1, lr.adam_beta2),
                                  foreach=True)  # fewer small kernels

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        if schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        if schedule == "linear":
            return 1.0 - progress
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
