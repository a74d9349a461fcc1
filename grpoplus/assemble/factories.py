"""Leaf factories: each turns its part of a run's plan (:mod:`grpoplus.plan.run`) into one component (policy, data,
rewards, engine, optimizer, collection), for any launch and any process of a run, the roles' own processes
included. The role-side ones (process, policy, optimizer, engine, rollout worker) take a role's plan, the driver-side
ones (rewards, collection, the task and its data: :mod:`grpoplus.assemble.data`) their part of the run's plan; none
reads the user's settings (``RunPlan.config``)."""

from __future__ import annotations

import functools
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from grpoplus.assemble.data import build_data, builtin_tasks, data_rows, fit_prompt_lengths
from grpoplus.collect import CollectPlan, collect
from grpoplus.containers import SamplingParams
from grpoplus.data.lengths import model_context
from grpoplus.data.order import PromptSampler
from grpoplus.learner.precision import COMPUTE_DTYPES, set_tf32
from grpoplus.models.attention import use_cpu_gqa
from grpoplus.models.cpu_matmul import use_cpu_matmul
from grpoplus.models.qlora import FourBit, parameter_count
from grpoplus.plan.driver import CollectionPlan, RewardsPlan
from grpoplus.plan.run import EnginePlan, LoraPlan, OptimizerPlan, PolicyPlan, ProcessPlan, RolloutRolePlan, RunPlan


def build_process(process: ProcessPlan) -> None:
    """Settings of every process of a run (the driver, learner ranks, rollout workers)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar: ours
    torch.manual_seed(process.seed)
    if process.device.startswith("cuda"):
        set_tf32(process.tf32)
    if process.threads:
        torch.set_num_threads(process.threads)
    use_cpu_matmul(process.cpu_matmul)  # the models grpoplus loads (marked as loaded); no other model's layers
    use_cpu_gqa()  # grouped key/value heads on a CPU attended without a copy per query head


def build_collect_plan(plan: RunPlan, tokenizer, model=None) -> CollectPlan:
    """Collection as the plan's ``collection`` part and the algorithm's filters (dynamic sampling, GFPO, ...) say."""
    c = plan.collection
    params = SamplingParams(n=c.group_size, temperature=c.temperature, top_p=c.top_p, max_new_tokens=c.max_new_tokens)
    return CollectPlan.from_algo(plan.learner.algo, params, c.prompts_per_step, tokenizer.pad_token_id,
                                 build_episodes(c, tokenizer, model))


def build_episodes(c: CollectionPlan, tokenizer, model):
    """The multi-turn plan (``data.env``, ``data.tools`` or the task's environment), or None for single-turn
    collection."""
    from grpoplus.envs.base import env_factory
    from grpoplus.envs.episodes import EpisodeLimits, EpisodePlan
    from grpoplus.envs.tools import ToolEnv, resolve_tools

    if c.env is None:
        return None
    limits = EpisodeLimits(max_turns=c.max_turns, max_tokens=c.max_episode_tokens, timeout_s=c.env_timeout_s,
                           patience_s=c.env_patience_s, max_context=context_length(model))
    factory = functools.partial(ToolEnv, resolve_tools(list(c.tools))) if c.tools else env_factory(c.env)
    return EpisodePlan(factory=factory, limits=limits, tokenizer=tokenizer, chat=c.chat_template)


def context_length(model) -> int:
    """Longest prompt + response the engines take for this model (EngineOptions.max_model_len)."""
    return min(model_context(getattr(model, "config", None)) or 4096, 8192)


def build_collector(max_staleness: int, engine, sampler: PromptSampler, train: list, scorer, plan: CollectPlan,
                    generator: torch.Generator):
    """Synchronous collection (max_staleness = 0), or collection ahead of the learner by at most K versions."""
    from grpoplus.distributed.staleness import BoundedStaleness, Synchronous

    collect_step = functools.partial(collect, engine, sampler, train, scorer, plan, generator)
    if max_staleness == 0:
        return Synchronous(collect_step, sampler, generator)
    return BoundedStaleness(collect_step, engine, sampler, generator, max_staleness)


def reward_weights(components: list) -> tuple[tuple[str, float], ...]:
    """(name, weight) of each reward component, for the learner plan."""
    return tuple((c.name, c.weight) for c in components)


def build_policy(policy: PolicyPlan, device: str, seed: int, trains: bool = True):
    """The policy and its tokenizer, as ``learner.model`` names them, on ``device`` (``seed``: the process's, which
    draws the built-in tiny model's warm-start problems); ``trains=False``: a copy that is not trained where it is
    loaded (the load check counts its weights alone)."""
    from grpoplus.models.load import is_builtin, load_policy
    from grpoplus.sft.warmstart import load_builtin

    name = policy.model
    with phase(f"loading model {name or f'(built-in tiny model, task {policy.task})'}"):
        if is_builtin(name):
            return load_builtin(name, policy.task, policy.difficulty, seed=seed, eval_seed=policy.eval_seed,
                                device=device, quantize=four_bit(policy))
        footprint = policy.footprint if trains else policy.footprint.copy_only()
        return load_policy(name, device=device, footprint=footprint, quantize=four_bit(policy))


def four_bit(policy: PolicyPlan) -> FourBit | None:
    """The 4-bit base of ``learner.quantize`` (computing in the learner's precision), or None."""
    return None if policy.quantize == "none" else FourBit(policy.quantize, COMPUTE_DTYPES[policy.precision])


@contextmanager
def phase(what: str):
    """A line on stderr when a long phase starts and one when it ends, with its duration (a silent
    minute looks like a hang)."""
    print(f"{what} ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    yield
    print(f"{what}: done in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)


def build_task_and_model(plan: RunPlan):
    """The task (built-in or a data set), its train/test examples (those whose prompts fit the model's context, per
    data.long_prompts), the policy with its tokenizer, and the metrics of step 0's record: the prompts dropped or cut
    (none with data.long_prompts=refuse: nothing was changed) and a data set's malformed rows skipped."""
    from grpoplus.models.load import builtin_without_template
    from grpoplus.tasks import check_chat_prompts

    data, seed, where = plan.data, plan.seed, plan.placement
    tasks, rows = builtin_tasks(data, seed), data_rows(data)  # a data set's rows are checked before the model loads
    if tasks:  # refused before the tiny model's warm start (and by the config rule task)
        check_chat_prompts(data.task, getattr(tasks[0], "chat", False), data.chat_template,
                           builtin_without_template(data.model))
    # on Ray the roles load their own; a sharded learner's rank 0 may keep its copy in host memory
    host = where.driver_copy_in_host_memory
    model, tokenizer = build_policy(plan.learner.policy, "cpu" if host else where.device, seed,
                                    trains=not (host and where.on_gpus))
    task, train, test = build_data(data, tokenizer, seed, tasks, rows)
    fit = fit_prompt_lengths(data, tokenizer, model_context(getattr(model, "config", None)), train, test)
    metrics = {**(fit.metrics() if data.long_prompts != "refuse" else {}), **(rows.metrics() if rows else {})}
    return task, fit.train, fit.test, model, tokenizer, metrics


def build_lora(lora: LoraPlan, model):
    """The policy with LoRA adapters (``learner.lora_*``; only the adapters train), or ``model`` itself
    when ``learner.lora_rank`` is 0."""
    from grpoplus.models.lora import add_lora

    if lora.rank == 0:
        return model
    return add_lora(model, lora.rank, lora.alpha, lora.dropout, list(lora.target_modules))


def build_rewards(rewards: RewardsPlan, task):
    """The reward pipeline of :func:`reward_components`, in-process or with a pool (``data.reward_workers``)."""
    from grpoplus.rewards import RewardPipeline

    return RewardPipeline(reward_components(rewards, task), workers=rewards.workers, timeout_s=rewards.timeout_s)


def build_scorer(rewards: RewardsPlan, device: str, task, train: list, tokenizer):
    """The run's scorer: the reward pipeline, and the process reward model of ``data.prm`` (on ``learner.device``)
    whose step scores are the step rewards of ``algo.turn_credit``."""
    from grpoplus.collect.scoring import Scorer

    prm = None
    if rewards.prm is not None:
        from grpoplus.rewards.prm import ProcessRewardModel

        with phase(f"loading process reward model {rewards.prm}"):
            prm = ProcessRewardModel(rewards.prm, step_separator=rewards.prm_step_separator, device=device)
    return Scorer(build_rewards(rewards, task), train, prm=prm, tokenizer=tokenizer)


def reward_components(rewards: RewardsPlan, task) -> list:
    """The configured reward components, the task verifier (weight 0 when not listed: accuracy is
    always its verdict), and DAPO's soft overlong punishment when ``overlong_shaping``."""
    from grpoplus.rewards import parse_reward_specs

    specs = list(rewards.specs)
    names = [comp.name for comp in parse_reward_specs(specs, extra={"task": task.reward})]
    if "task" not in names:
        specs.append("task:0")
    if rewards.soft_overlong is not None:  # the rule sampling_and_rewards refuses soft_overlong listed as well
        max_len, cache = rewards.soft_overlong
        specs.append({"name": "soft_overlong", "kwargs": {"max_len": max_len, "cache": cache}})
    return parse_reward_specs(specs, extra={"task": task.reward})


def build_engine(engine: EnginePlan, model, tokenizer, seed: int, record_routing: bool = False):
    """The rollout engine (``seed``: its process's); ``record_routing`` (an MoE policy): it returns the sampler's expert
    routing when it can."""
    from grpoplus.models.vision import processor_of
    from grpoplus.rollout import ENGINES, EngineOptions

    factory = ENGINES.get(engine.name)
    options = EngineOptions(quantization=engine.quantization, max_num_seqs=engine.max_num_seqs or None,
                            max_model_len=context_length(model), seed=seed, start_timeout_s=engine.timeout_s,
                            generate_timeout_s=engine.timeout_s, extra=dict(engine.kwargs), compile=engine.compile,
                            release_memory=engine.release_memory,
                            dtype=COMPUTE_DTYPES[engine.precision],
                            record_routing=record_routing and getattr(factory, "returns_routing", False))
    with phase(f"starting rollout engine {engine.name}"):
        # the hf engine encodes a vision-language policy's prompts with its processor
        return factory(model, (processor_of(tokenizer) if engine.name == "hf" else None) or tokenizer, options)


TOY_PARAMETERS = 10_000_000  # below this a model is a toy (the built-in tiny ones: 0.34M), trained at a toy's rate
LEARNING_RATES = {"toy": 2e-4, "full": 1e-6, "lora": 1e-5}
SFT_LEARNING_RATES = {"toy": 3e-3, "full": 1e-5, "lora": 1e-4}  # a supervised stage's (the built-in warm start's toy rate)


def learning_rate(opt: OptimizerPlan, model: torch.nn.Module) -> float:
    """``learner.lr``, or when unset the one that fits the model (a rate tuned on the 0.34M built-in model damages
    a real one within steps): toy, full fine-tuning or LoRA, said once on stderr for a real model."""
    if opt.lr is not None:
        return opt.lr
    size = parameter_count(model)
    kind = "toy" if size < TOY_PARAMETERS else "lora" if opt.lora else "full"
    rates = SFT_LEARNING_RATES if opt.stage == "sft" else LEARNING_RATES
    follower = torch.distributed.is_initialized() and torch.distributed.get_rank() > 0
    if kind != "toy" and not follower:
        what = "LoRA adapters" if kind == "lora" else "full fine-tuning"
        print(f"grpoplus: note: learner.lr={rates[kind]:g} ({what} of a {size / 1e6:.0f}M-parameter model"
              f"{', supervised' if opt.stage == 'sft' else ''}; set learner.lr to choose)", file=sys.stderr)
    return rates[kind]


def build_optimizer(opt: OptimizerPlan, model):
    """AdamW with linear warm-up then constant / cosine / linear decay (per optimizer step)."""
    warmup, schedule, total = opt.warmup_steps, opt.schedule, opt.total_steps
    params = [p for p in model.parameters() if p.requires_grad]
    # The fused kernel (CPU and CUDA) updates each tensor in one pass: no temporary copy of every parameter
    # (the foreach path's peak) and several times faster on a CPU; elsewhere the foreach path.
    kernel = {"fused": True} if params and params[0].device.type in ("cpu", "cuda") else {"foreach": True}
    optimizer = torch.optim.AdamW(params, lr=learning_rate(opt, model), weight_decay=opt.weight_decay,
                                  betas=opt.betas, **kernel)

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


@dataclass
class WorkerParts:
    """What a rollout worker's process holds: its copy of the policy and the engine sampling with it."""

    model: torch.nn.Module
    engine: object
    release_memory: bool  # give the rollout's freed memory back after each request (run.release_memory)
    device: str  # where the worker's engine runs (and the collective weight sync receives)


def build_rollout_worker(role: RolloutRolePlan) -> WorkerParts:
    """A Ray rollout worker's parts, in its own process, from its role's plan (the weights come with sync). A vLLM
    worker's copy of the policy is only what vLLM is started from and synced through (vLLM holds its own weights):
    it stays in host memory, never beside vLLM on the GPU."""
    from grpoplus.learner.replay import check_replay

    build_process(role.process)
    device = role.process.own_device
    model, tokenizer = build_policy(role.policy, "cpu" if role.host_copy else device, role.process.seed, trains=False)
    moe = check_replay(role.routing_replay, model) is not None  # the sampler's routing, as in one process
    engine = build_engine(role.engine, model, tokenizer, role.process.seed, record_routing=moe)
    return WorkerParts(model, engine, role.release_memory, device)
