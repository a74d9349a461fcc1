"""Config -> components: the one place that turns a validated config into objects."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from grpoplus.collect import CollectPlan
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

    def close(self) -> None:
        self.scorer.close()
        self.engine.close()


def build(cfg: Config) -> Components:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar: ours
    torch.manual_seed(cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    task, train, test, model, tokenizer = build_task_and_model(cfg)
    lora = cfg.learner.lora_rank > 0
    if lora:
        model = build_lora(cfg, model)
    # With LoRA the reference is the same model with its adapters off (no second copy).
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.algo.beta > 0 and not lora else None
    scorer = Scorer(build_rewards(cfg, task), train)
    engine = build_engine(cfg, model, tokenizer)
    optimizer, scheduler = build_optimizer(cfg, model)
    params = SamplingParams(n=cfg.rollout.group_size, temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                            max_new_tokens=cfg.rollout.max_new_tokens)
    collect_plan = CollectPlan.from_algo(cfg.algo, params, cfg.rollout.prompts_per_step, tokenizer.pad_token_id)
    # LoRA dropout makes the training forward stochastic: pi_old then needs its own pass.
    source = "recompute" if lora and cfg.learner.lora_dropout > 0 and cfg.learner.logp_old == "auto" \
        else cfg.learner.logp_old
    learner_plan = LearnerPlan(cfg.rollout.temperature, cfg.learner.micro_batch_size, cfg.learner.max_grad_norm,
                               logp_old_mode(cfg.algo, source, cfg.algo.beta > 0),
                               micro_batch_tokens=cfg.learner.micro_batch_tokens,
                               reference_adapters_off=lora and cfg.algo.beta > 0)
    return Components(task, train, test[: cfg.data.eval_size], model, tokenizer, ref_model, engine, scorer, optimizer,
                      scheduler, PromptSampler(len(train), cfg.run.seed), torch.Generator().manual_seed(cfg.run.seed),
                      collect_plan, learner_plan)


def build_task_and_model(cfg: Config):
    """The task (built-in or a data set), its train/test examples, and the policy with its tokenizer."""
    from grpoplus.models.load import is_builtin, load_policy
    from grpoplus.tasks import get_task
    from grpoplus.tasks.dataset import dataset_task
    from grpoplus.tasks.synthetic import with_chat_template

    d, name = cfg.data, cfg.learner.model
    task = None
    if d.data is None:
        task = get_task(d.task, seed=cfg.run.seed, **({} if d.difficulty is None else {"difficulty": d.difficulty}))
    chat = task is not None and getattr(task, "chat", False) and d.chat_template
    if chat and is_builtin(name):  # refused before the tiny model's warm start, which takes minutes
        raise ValueError(f"task {d.task!r} writes chat prompts for an instruct model: pass --model (e.g. smollm2), "
                         "or data.chat_template=false to warm-start the built-in tiny model on the raw prompts")
    model, tokenizer = load_policy(name, task=d.task if task is not None else None, difficulty=d.difficulty,
                                   device=cfg.learner.device, seed=cfg.run.seed, lora=cfg.learner.lora_rank > 0)
    if task is None:
        task = dataset_task(d, tokenizer if d.chat_template else None, seed=cfg.run.seed)
    elif chat:
        task = with_chat_template(task, tokenizer, name)
    return task, list(task.split("train")), list(task.split("test")), model, tokenizer


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
