"""Config -> components: the one place that turns a validated config into objects."""

from __future__ import annotations

import copy
import functools
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from grpoplus.algo import EntropyControl
from grpoplus.collect import CollectPlan, collect
from grpoplus.config import Config
from grpoplus.containers import SamplingParams
from grpoplus.learner.precision import COMPUTE_DTYPES, check_precision, lower_frozen_linears, set_tf32
from grpoplus.learner.prepare import LearnerPlan, logp_old_mode
from grpoplus.learner.checkpointing import require_checkpointable
from grpoplus.learner.replay import check_replay
from grpoplus.models.memory import EAGER_TRIM_LAYERS
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
    if cfg.learner.device.startswith("cuda"):
        set_tf32(cfg.learner.tf32)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)


def build(cfg: Config) -> Components:
    build_process(cfg)
    logp_old_mode(cfg.algo, logp_old_source(cfg), uses_reference=cfg.algo.beta > 0)  # a bad choice fails first
    check_precision(cfg.learner.precision, cfg.learner.device)
    check_engine_routing(cfg)
    task, train, test, model, tokenizer = build_task_and_model(cfg)
    routing = check_replay(cfg.algo.routing_replay, model)  # the MoE routing shape; None for a dense policy
    if cfg.run.cluster == "ray":
        return build_on_ray(cfg, task, train, test, model, tokenizer)
    model = build_lora(cfg, model)
    scorer = Scorer(build_rewards(cfg, task), train)
    group, launcher = start_learner_group(cfg)
    try:
        parts, plan = build_learner_rank_parts(cfg, model, group, reward_weights(scorer.pipeline.components))
        policy = parts.policy  # a plain module holding the whole policy: what the engines sample with
        engine = build_engine(cfg, policy, tokenizer, record_routing=routing is not None)
        collect_plan = build_collect_plan(cfg, tokenizer)
        sampler, generator = PromptSampler(len(train), cfg.run.seed), torch.Generator().manual_seed(cfg.run.seed)
        if cfg.rollout.max_staleness == 0:  # the synchronous loop: the engine samples with the learner's weights
            collector = build_collector(cfg, engine, sampler, train, scorer, collect_plan, generator)
            targets = (engine,)
        else:  # sampling runs ahead of the learner on its own copy of the policy
            from grpoplus.distributed.staleness import SnapshotEngine

            copy_model = copy.deepcopy(policy)
            sampling = SnapshotEngine(build_engine(cfg, copy_model, tokenizer, record_routing=routing is not None))
            collector = build_collector(cfg, sampling, sampler, train, scorer, collect_plan, generator)
            targets = (engine, collector)
    except BaseException:
        if launcher is not None:
            launcher.close()
        raise
    from grpoplus.distributed.learner import Learner

    learner = Learner(parts, cfg.algo, plan, group, targets, launcher=launcher)
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


def build_learner_parts(cfg: Config, model: torch.nn.Module, mirror: torch.nn.Module | None = None):
    """The policy with its optimizer and schedule, the frozen reference when beta > 0, and the entropy
    bonus's coefficient; with ``learner.strategy=fsdp2`` over several ranks the policy is sharded here (rank 0
    passes ``mirror``, its plain copy; the reference stays whole on every rank)."""
    from grpoplus.distributed.learner import LearnerParts
    from grpoplus.distributed.sharding import shard

    # With LoRA the reference is the same model with its adapters off (no second copy).
    copied = cfg.algo.beta > 0 and cfg.learner.lora_rank == 0
    ref_model = lower_frozen_linears(copy.deepcopy(model).eval().requires_grad_(False), cfg.learner.precision) \
        if copied else None
    if is_sharded(cfg):
        shard(model, cfg.learner.precision)
    optimizer, scheduler = build_optimizer(cfg, model)
    return LearnerParts(model, ref_model, optimizer, scheduler, EntropyControl.from_config(cfg.algo), mirror)


def is_sharded(cfg: Config) -> bool:
    """True when the learner's parameters are sharded over its ranks (learner.strategy=fsdp2, several ranks)."""
    return cfg.learner.strategy == "fsdp2" and cfg.learner.data_parallel > 1


def build_learner_rank_parts(cfg: Config, model: torch.nn.Module, group, rewards: tuple = ()):
    """One local learner rank's (parts, plan): every rank starts from rank 0's weights (whatever it loaded
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


def logp_old_source(cfg: Config) -> str:
    """``learner.logp_old``, except that LoRA dropout makes the training forward stochastic: pi_old then
    needs its own pass."""
    lrn = cfg.learner
    return "recompute" if lrn.lora_rank and lrn.lora_dropout > 0 and lrn.logp_old == "auto" else lrn.logp_old


def reward_weights(components: list) -> tuple[tuple[str, float], ...]:
    """(name, weight) of each reward component, for the learner plan."""
    return tuple((c.name, c.weight) for c in components)


def start_learner_group(cfg: Config):
    """(group, launcher): None, None for one learner rank; else this process joins as rank 0 of
    ``learner.data_parallel`` ranks on this machine (started here: the launcher) or under torchrun."""
    from grpoplus.distributed.group import RankGroup
    from grpoplus.distributed.local import start_ranks

    if cfg.learner.data_parallel == 1:
        return None, None
    rendezvous, ranks = start_ranks(cfg)
    try:
        group = RankGroup.join(rendezvous)
    except BaseException:
        if ranks is not None:
            ranks.close()
        raise
    if ranks is not None:
        group.describe_peers = ranks.describe
    return group, ranks


def build_learner_rank(cfg: Config, device: str):
    """What a follower learner rank builds before it joins the group: its copy of the policy."""
    build_process(cfg)
    model, _ = build_policy(cfg, device)
    return model


def build_on_ray(cfg: Config, task, train: list, test: list, model, tokenizer) -> Components:
    """cluster=ray: rollout workers, the learner group and reward scoring as Ray actors and tasks; the
    driver (this process) runs the loop, the collection's bookkeeping and evaluation requests."""
    import ray

    from grpoplus.distributed.ray_cluster import Cluster
    from grpoplus.distributed.ray_learner import RayLearnerGroup
    from grpoplus.distributed.ray_rollout import RayRolloutEngine
    from grpoplus.distributed.ray_scoring import RayScorer
    from grpoplus.sync import ObjectStore

    r, lrn, rc = cfg.rollout, cfg.learner, cfg.ray
    cluster = Cluster(rc.address, rc.num_cpus, rc.timeout_s)
    gpu = lrn.device.startswith("cuda")
    cluster.require_gpus(gpu * (r.workers + lrn.data_parallel),
                         f"rollout.workers={r.workers} and learner.data_parallel={lrn.data_parallel}")
    config, weights = cfg.to_dict(), ray.put({k: v.detach().cpu() for k, v in model.state_dict().items()})
    engine = RayRolloutEngine(config, ObjectStore(weights), r.workers, r.engine, tokenizer.pad_token_id, seed=cfg.run.seed,
                              gpu=gpu, max_restarts=rc.max_restarts, timeout_s=r.engine_timeout_s,
                              start_timeout_s=rc.timeout_s, collective=rc.weight_sync == "collective")
    components = reward_components(cfg, task)
    scorer = RayScorer(components, train, cfg.data.reward_workers, cfg.data.reward_timeout_s, rc.timeout_s)
    collect_plan = build_collect_plan(cfg, tokenizer)
    sampler, generator = PromptSampler(len(train), cfg.run.seed), torch.Generator().manual_seed(cfg.run.seed)
    collector = build_collector(cfg, engine, sampler, train, scorer, collect_plan, generator)
    targets = (engine,) if r.max_staleness == 0 else (collector,)
    learner = RayLearnerGroup(config, weights, lrn.data_parallel, targets, reward_weights(components), gpu=gpu,
                              timeout_s=rc.timeout_s)
    if rc.weight_sync == "collective":
        learner.form_weight_sync(engine.actors, lrn.collective_timeout_s)
    return Components(task, train, test[: cfg.data.eval_size], tokenizer, engine, scorer, sampler, generator,
                      collect_plan, learner, collector, cluster)


def build_policy(cfg: Config, device: str | None = None):
    """The policy and its tokenizer, as ``learner.model`` names them, on ``device`` (default learner.device)."""
    from grpoplus.models.load import load_policy

    d = cfg.data
    with phase(f"loading model {cfg.learner.model or f'(built-in tiny model, task {d.task})'}"):
        return load_policy(cfg.learner.model, task=d.task if d.data is None else None, difficulty=d.difficulty,
                           device=device or cfg.learner.device, seed=cfg.run.seed, eval_seed=d.eval_seed,
                           lora=cfg.learner.lora_rank > 0)


@contextmanager
def phase(what: str):
    """A line on stderr when a long phase starts and one when it ends, with its duration (a silent
    minute looks like a hang)."""
    print(f"{what} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    yield
    print(f"{what}: done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)


def build_task_and_model(cfg: Config):
    """The task (built-in or a data set), its train/test examples, and the policy with its tokenizer."""
    from grpoplus.models.load import is_builtin

    d, name = cfg.data, cfg.learner.model
    tasks = builtin_tasks(cfg)
    if tasks and getattr(tasks[0], "chat", False) and d.chat_template and is_builtin(name):  # refused before the tiny model's warm start
        raise ValueError(f"task {d.task!r} writes chat prompts for an instruct model: pass --model (e.g. smollm2), "
                         "or data.chat_template=false to warm-start the built-in tiny model on the raw prompts")
    model, tokenizer = build_policy(cfg, "cpu" if cfg.run.cluster == "ray" else None)  # on Ray: the roles' devices
    return (*build_data(cfg, tokenizer, tasks), model, tokenizer)


def builtin_tasks(cfg: Config) -> tuple | None:
    """(task, held_out) of a built-in task: its training problems from ``run.seed``, its held-out ones
    from ``data.eval_seed``; None for a data set."""
    from grpoplus.tasks import get_task

    d = cfg.data
    if d.data is not None:
        return None
    kwargs = {} if d.difficulty is None else {"difficulty": d.difficulty}
    task = get_task(d.task, seed=cfg.run.seed, **kwargs)
    return task, (task if d.eval_seed == cfg.run.seed else get_task(d.task, seed=d.eval_seed, **kwargs))


def build_data(cfg: Config, tokenizer, tasks: tuple | None = None) -> tuple[object, list, list]:
    """(task, train, test): the held-out problems come from ``data.eval_seed``, the training ones from
    ``run.seed``, and no training prompt is a held-out one (splits of different seeds may share problems).
    A task of chat prompts goes through the tokenizer's chat template (``data.chat_template``)."""
    from grpoplus.tasks import without_prompts
    from grpoplus.tasks.dataset import dataset_task
    from grpoplus.tasks.synthetic import with_chat_template

    d = cfg.data
    tasks = tasks or builtin_tasks(cfg)
    if tasks is None:  # the held-out rows of a split data set are chosen by eval_seed
        task = dataset_task(d, tokenizer if d.chat_template else None, seed=d.eval_seed)
        held_out = task
    elif getattr(tasks[0], "chat", False) and d.chat_template:
        task, held_out = (with_chat_template(t, tokenizer, cfg.learner.model) for t in tasks)
    else:
        task, held_out = tasks
    test = list(held_out.split("test"))
    return task, without_prompts(task.split("train"), test), test


def build_lora(cfg: Config, model):
    """The policy with LoRA adapters (``learner.lora_*``; only the adapters train), or ``model`` itself
    when ``learner.lora_rank`` is 0."""
    from grpoplus.models.lora import add_lora

    lr = cfg.learner
    if lr.lora_rank == 0:
        return model
    return add_lora(model, lr.lora_rank, lr.lora_alpha, lr.lora_dropout, lr.lora_target_modules)


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


def check_engine_routing(cfg: Config) -> None:
    """R3 replays the experts the rollout engine routed each token to: refuse an engine that cannot
    return them before anything is loaded (engines that can set ``returns_routing = True``)."""
    from grpoplus.rollout import ENGINES

    if cfg.algo.routing_replay != "r3" or getattr(ENGINES.get(cfg.rollout.engine), "returns_routing", False):
        return
    able = [name for name in ENGINES.names() if getattr(ENGINES.get(name), "returns_routing", False)]
    raise ValueError(f"algo.routing_replay=r3 replays the experts the rollout engine routed each token to, but "
                     f"rollout.engine={cfg.rollout.engine} does not return them here (engines that do: "
                     f"{', '.join(able)}): use one of those, or algo.routing_replay=r2 (the learner's own routing)")


def build_engine(cfg: Config, model, tokenizer, record_routing: bool = False):
    """The rollout engine; ``record_routing`` (an MoE policy): it returns the sampler's expert routing when it can."""
    from grpoplus.rollout import ENGINES, EngineOptions

    r = cfg.rollout
    factory = ENGINES.get(r.engine)
    max_len = getattr(model.config, "max_position_embeddings", None) or 4096
    options = EngineOptions(quantization=r.quantization, max_num_seqs=r.max_num_seqs or None,
                            max_model_len=min(max_len, 8192), seed=cfg.run.seed, start_timeout_s=r.engine_timeout_s,
                            generate_timeout_s=r.engine_timeout_s, extra=dict(r.engine_kwargs),
                            dtype=COMPUTE_DTYPES[cfg.learner.precision],
                            record_routing=record_routing and getattr(factory, "returns_routing", False))
    with phase(f"starting rollout engine {r.engine}"):
        return factory(model, tokenizer, options)


def build_optimizer(cfg: Config, model):
    """AdamW with linear warm-up then constant / cosine / linear decay (per optimizer step)."""
    lr = cfg.learner
    warmup, schedule = lr.warmup_steps, lr.lr_schedule
    total = cfg.run.max_steps * cfg.algo.updates_per_batch
    params = [p for p in model.parameters() if p.requires_grad]
    # The fused kernel (CPU and CUDA) updates each tensor in one pass: no temporary copy of every parameter
    # (the foreach path's peak) and several times faster on a CPU; elsewhere the foreach path.
    kernel = {"fused": True} if params and params[0].device.type in ("cpu", "cuda") else {"foreach": True}
    optimizer = torch.optim.AdamW(params, lr=lr.lr, weight_decay=lr.weight_decay,
                                  betas=(lr.adam_beta1, lr.adam_beta2), **kernel)

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
