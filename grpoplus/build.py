"""Config -> components: the one place that turns a validated config into objects."""

from __future__ import annotations

import copy
import math
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from grpoplus.algo import EntropyControl
from grpoplus.collect import CollectPlan
from grpoplus.config import Config
from grpoplus.containers import SamplingParams
from grpoplus.learner.prepare import LearnerPlan, logp_old_mode
from grpoplus.learner.replay import check_replay
from grpoplus.prompts import PromptSampler
from grpoplus.scoring import Scorer


@dataclass
class Components:
    """Everything a run needs, built once from its config."""

    task: object
    train: list
    test: list
    model: torch.nn.Module
    tokenizer: object
    ref_model: torch.nn.Module | None
    engine: object
    scorer: Scorer
    optimizer: torch.optim.Optimizer
    scheduler: object
    sampler: PromptSampler
    generator: torch.Generator
    collect_plan: CollectPlan
    learner_plan: LearnerPlan
    entropy_control: EntropyControl  # the entropy bonus's coefficient (adaptive: state saved in checkpoints)

    def close(self) -> None:
        self.scorer.close()
        self.engine.close()


def build(cfg: Config) -> Components:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar: ours
    torch.manual_seed(cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    lora = cfg.learner.lora_rank > 0
    # LoRA dropout makes the training forward stochastic: pi_old then needs its own pass.
    source = "recompute" if lora and cfg.learner.lora_dropout > 0 and cfg.learner.logp_old == "auto" \
        else cfg.learner.logp_old
    logp_old = logp_old_mode(cfg.algo, source, uses_reference=cfg.algo.beta > 0)
    check_engine_routing(cfg)
    task, train, test, model, tokenizer = build_task_and_model(cfg)
    routing = check_replay(cfg.algo.routing_replay, model)  # the MoE routing shape; None for a dense policy
    if lora:
        model = build_lora(cfg, model)
    # With LoRA the reference is the same model with its adapters off (no second copy).
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.algo.beta > 0 and not lora else None
    scorer = Scorer(build_rewards(cfg, task), train)
    engine = build_engine(cfg, model, tokenizer, record_routing=routing is not None)
    optimizer, scheduler = build_optimizer(cfg, model)
    params = SamplingParams(n=cfg.rollout.group_size, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_new_tokens=cfg.rollout.max_new_tokens)
    collect_plan = CollectPlan.from_algo(cfg.algo, params, cfg.rollout.prompts_per_step, tokenizer.pad_token_id)
    learner_plan = LearnerPlan(cfg.rollout.temperature, cfg.learner.micro_batch_size, cfg.learner.max_grad_norm,
                               logp_old, micro_batch_tokens=cfg.learner.micro_batch_tokens,
                               routing_replay=cfg.algo.routing_replay, routing_spec=routing, seed=cfg.run.seed,
                               reward_weights=tuple((c.name, c.weight) for c in scorer.pipeline.components),
                               reference_adapters_off=lora and cfg.algo.beta > 0)
    return Components(task, train, test[: cfg.data.eval_size], model, tokenizer, ref_model, engine, scorer, optimizer,
                      scheduler, PromptSampler(len(train), cfg.run.seed), torch.Generator().manual_seed(cfg.run.seed),
                      collect_plan, learner_plan, EntropyControl.from_config(cfg.algo))


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
    from grpoplus.models.load import is_builtin, load_policy

    d, name = cfg.data, cfg.learner.model
    tasks = builtin_tasks(cfg)
    if tasks and getattr(tasks[0], "chat", False) and d.chat_template and is_builtin(name):  # refused before the tiny model's warm start
        raise ValueError(f"task {d.task!r} writes chat prompts for an instruct model: pass --model (e.g. smollm2), "
                         "or data.chat_template=false to warm-start the built-in tiny model on the raw prompts")
    with phase(f"loading model {name or f'(built-in tiny model, task {d.task})'}"):
        model, tokenizer = load_policy(name, task=d.task if d.data is None else None, difficulty=d.difficulty,
                                       device=cfg.learner.device, seed=cfg.run.seed, eval_seed=d.eval_seed,
                                       lora=cfg.learner.lora_rank > 0)
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
    """The policy with LoRA adapters (``learner.lora_*``); only the adapters train."""
    from grpoplus.models.lora import add_lora

    lr = cfg.learner
    return add_lora(model, lr.lora_rank, lr.lora_alpha, lr.lora_dropout, lr.lora_target_modules)


def build_rewards(cfg: Config, task):
    """The reward pipeline: the configured components, the task verifier (weight 0 when not listed:
    accuracy is always its verdict), and DAPO's soft overlong punishment when ``overlong_shaping``."""
    from grpoplus.rewards import RewardPipeline, parse_reward_specs

    specs = list(cfg.data.rewards)
    names = [comp.name for comp in parse_reward_specs(specs, extra={"task": task.reward})]
    if "task" not in names:
        specs.append("task:0")
    if cfg.algo.overlong_shaping:
        if "soft_overlong" in names:
            raise ValueError("algo.overlong_shaping adds the soft_overlong reward itself: drop it from data.rewards "
                             "or set overlong_shaping=false")
        specs.append({"name": "soft_overlong", "kwargs": {"max_len": cfg.algo.max_len, "cache": cfg.algo.cache_len}})
    components = parse_reward_specs(specs, extra={"task": task.reward})
    return RewardPipeline(components, workers=cfg.data.reward_workers, timeout_s=cfg.data.reward_timeout_s)


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
                            record_routing=record_routing and getattr(factory, "returns_routing", False))
    with phase(f"starting rollout engine {r.engine}"):
        return factory(model, tokenizer, options)


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
