"""The training loop: rollout -> rewards -> advantages and filters -> updates, evaluated and
checkpointed. Everything algorithmic lives in :mod:`grpoplus.algo`; this file only calls
the stages in order and writes what they report."""

from __future__ import annotations

import copy
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from grpoplus import algo as A
from grpoplus.batching import PromptSampler, build_train_batch, collect
from grpoplus.config import Config, build_config
from grpoplus.evaluation import evaluate, rollout_metrics
from grpoplus.learner import checkpoint as ckpt
from grpoplus.learner.update import build_optimizer, update_policy
from grpoplus.metrics import LiveDoctor, MetricsWriter, read_metrics
from grpoplus.metrics.writer import truncate_jsonl
from grpoplus.rollout import ENGINES, SamplingParams
from grpoplus.build import build_rewards, build_task_and_model


KILL_AFTER_STEP_ENV = "GRPOPLUS_FAULT_KILL_AFTER_STEP"


@dataclass
class Components:
    task: object
    train: list
    test: list
    model: torch.nn.Module
    tokenizer: object
    ref_model: torch.nn.Module | None
    engine: object
    rewards: object
    correct_key: str
    optimizer: torch.optim.Optimizer
    scheduler: object
    sampler: PromptSampler
    generator: torch.Generator


def build(cfg: Config) -> Components:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one progress bar: ours
    torch.manual_seed(cfg.run.seed)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    task, train, test, model, tokenizer = build_task_and_model(cfg)
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if cfg.algo.beta > 0 else None
    engine = ENGINES.get(cfg.rollout.engine)(model, tokenizer, sampler_precision=cfg.rollout.sampler_precision)
    rewards, correct_key = build_rewards(cfg, task)
    steps_per_batch = cfg.algo.num_iterations * cfg.algo.num_minibatches
    optimizer, scheduler = build_optimizer(
        model, lr=cfg.learner.lr, weight_decay=cfg.learner.weight_decay,
        betas=(cfg.learner.adam_beta1, cfg.learner.adam_beta2), warmup_steps=cfg.learner.warmup_steps,
        schedule=cfg.learner.lr_schedule, total_steps=cfg.run.max_steps * steps_per_batch)
    return Components(task, train, test[: cfg.data.eval_size], model, tokenizer, ref_model, engine, rewards,
                      correct_key, optimizer, scheduler, PromptSampler(len(train), cfg.run.seed),
                      torch.Generator().manual_seed(cfg.run.seed))


def trainer_state(c: Components, step: int, counters: dict) -> dict:
    return {"step": step, "optimizer": c.optimizer.state_dict(), "scheduler": c.scheduler.state_dict(),
            "sampler": c.sampler.state(), "generator": c.generator.get_state(), "rng": ckpt.rng_state(),
            "counters": dict(counters)}


def restore(c: Components, path: Path) -> tuple[int, dict]:
    ckpt.load_weights(c.model, path)
    state = ckpt.load_state(path)
    c.optimizer.load_state_dict(state["optimizer"])
    c.scheduler.load_state_dict(state["scheduler"])
    c.sampler.load(state["sampler"])
    c.generator.set_state(state["generator"])
    ckpt.set_rng_state(state["rng"])
    if c.ref_model is not None:
        ckpt.load_reference(c.ref_model, path)
    c.engine.sync_weights(c.model)
    return state["step"], state["counters"]


def train_step(cfg: Config, c: Components, step: int) -> tuple[dict, object]:
    """One rollout batch: sample, score, filter, prepare and update. Returns (metrics, scored batch)."""
    params = SamplingParams(n=cfg.rollout.group_size, temperature=cfg.rollout.temperature,
                            top_p=cfg.rollout.top_p, max_new_tokens=cfg.rollout.max_new_tokens)
    scored, drawn, metrics = collect(c.engine, c.sampler, c.train, c.rewards, cfg.algo, params,
                                     cfg.rollout.prompts_per_step, c.generator, c.tokenizer.pad_token_id,
                                     c.correct_key)
    t0 = time.perf_counter()
    if scored is None:  # every group had zero spread and nothing was kept: no update this step
        metrics.update(rollout_metrics(drawn, None, None))
        metrics.update({"optim/skipped_updates": 0.0, "time/learner_s": 0.0})
        return metrics, drawn[-1]
    batch, prep_metrics, entropy = build_train_batch(
        scored, c.model, c.ref_model, cfg.algo, temperature=cfg.rollout.temperature,
        micro_batch_size=cfg.learner.micro_batch_size, logp_old_source=cfg.learner.logp_old)
    metrics.update(prep_metrics)
    learner_metrics, update_entropy = update_policy(
        c.model, c.optimizer, c.scheduler, batch, cfg.algo, temperature=cfg.rollout.temperature,
        micro_batch_size=cfg.learner.micro_batch_size, max_grad_norm=cfg.learner.max_grad_norm)
    metrics.update(learner_metrics)
    metrics.update(rollout_metrics(drawn, entropy if entropy is not None else update_entropy,
                                   scored.rollouts.response_mask))
    c.engine.sync_weights(c.model)
    if c.ref_model is not None and cfg.algo.ref_reset_every and step % cfg.algo.ref_reset_every == 0:
        A.reset_reference(c.ref_model, c.model, c.optimizer, cfg.algo.ref_reset_optimizer)
    learner_s = time.perf_counter() - t0
    tokens = float(scored.rollouts.response_mask.sum())
    metrics.update({"time/learner_s": learner_s,
                    "throughput/learner_tok_s": tokens * cfg.algo.num_iterations / max(learner_s, 1e-9),
                    "throughput/rollout_tok_s": sum(float(s.rollouts.response_mask.sum()) for s in drawn)
                    / max(metrics["time/rollout_s"], 1e-9)})
    return metrics, scored


def run_eval(cfg: Config, c: Components, step: int) -> dict:
    return evaluate(c.engine, c.task, c.test, max_new_tokens=cfg.rollout.max_new_tokens,
                    temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                    samples=cfg.rollout.eval_samples, seed=cfg.run.seed * 7919 + step)


def write_samples(path: Path, step: int, scored, k: int) -> None:
    r = scored.rollouts
    with open(path, "a") as handle:
        for i in range(min(k, len(r.texts))):
            handle.write(json.dumps({"step": step, "prompt_index": r.prompt_index[int(r.group_ids[i])],
                                     "completion": r.texts[i], "reward": float(scored.rewards[i]),
                                     "correct": bool(scored.correct[i]), "finished": bool(r.finished[i])}) + "\n")


def train(cfg: Config, resume: bool = False) -> list[dict]:
    """Run (or resume) training; returns the metric records written by this call."""
    run_dir = Path(cfg.run.out)
    if not resume:
        clear_run_dir(run_dir, cfg.run.overwrite)
    run_dir.mkdir(parents=True, exist_ok=True)
    c = build(cfg)
    start, counters = 0, {"skipped_total": 0.0, "elapsed_s": 0.0}
    latest = ckpt.latest_checkpoint(run_dir) if resume else None
    if latest is not None:
        start, counters = restore(c, latest)
        print(f"resuming from {latest} (step {start})", file=sys.stderr)
    elif resume:
        print(f"no complete checkpoint in {run_dir}: starting from step 0", file=sys.stderr)
        clear_run_dir(run_dir, overwrite=True)  # what was logged before the first checkpoint is redone
    cfg.save(run_dir / "config.yaml")
    truncate_jsonl(run_dir / "samples.jsonl", start)
    writer = MetricsWriter(run_dir, tensorboard=cfg.run.tensorboard, resume_step=start if latest else None)
    doctor, records = LiveDoctor(), []
    history = read_metrics(run_dir) if latest else []  # the steps before this call, for the doctor
    progress = Progress(cfg, start)
    try:
        if start == 0:
            records.append(log(writer, 0, run_eval(cfg, c, 0)))
            history.append(records[-1])
        for step in range(start + 1, cfg.run.max_steps + 1):
            t0 = time.perf_counter()
            metrics, scored = train_step(cfg, c, step)
            last = step == cfg.run.max_steps
            if last or (cfg.run.eval_every and step % cfg.run.eval_every == 0):
                metrics.update(run_eval(cfg, c, step))
            counters["skipped_total"] += metrics.get("optim/skipped_updates", 0.0)
            counters["elapsed_s"] += time.perf_counter() - t0
            metrics.update({"optim/skipped_total": counters["skipped_total"], "time/elapsed_s": counters["elapsed_s"],
                            "time/step_s": time.perf_counter() - t0})
            records.append(log(writer, step, metrics))
            history.append(records[-1])
            write_samples(run_dir / "samples.jsonl", step, scored, cfg.run.log_samples)
            if last or (cfg.run.save_every and step % cfg.run.save_every == 0):
                ckpt.save_checkpoint(run_dir, step, c.model, c.tokenizer, trainer_state(c, step, counters),
                                     c.ref_model, keep=cfg.run.keep_checkpoints)
            progress.update(step, metrics)
            if os.environ.get(KILL_AFTER_STEP_ENV) == str(step):  # fault injection for the resume test
                os.kill(os.getpid(), signal.SIGKILL)
            if cfg.run.doctor_every and step % cfg.run.doctor_every == 0:
                for finding in doctor.check(history):
                    progress.write(f"doctor: {finding.one_line()}")
    finally:
        progress.close()
        writer.close()
        c.rewards.close()
    return records


RUN_OUTPUTS = ("metrics.jsonl", "samples.jsonl", "checkpoints", "tb", "report")


def clear_run_dir(run_dir: Path, overwrite: bool) -> None:
    """Refuse to mix two runs in one directory; with ``overwrite`` delete the old run's outputs."""
    import shutil

    existing = [name for name in RUN_OUTPUTS if (run_dir / name).exists()]
    if not existing:
        return
    if not overwrite:
        raise ValueError(f"run directory {str(run_dir)!r} already holds a run ({', '.join(existing)}); "
                         f"continue it with `grpoplus train --resume {run_dir}`, choose another --out, "
                         "or pass overwrite=true to start it afresh")
    for name in existing:
        path = run_dir / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()


def log(writer, step: int, metrics: dict) -> dict:
    record = {"step": step, **{k: float(v) for k, v in sorted(metrics.items())}}
    writer.log(step, record)
    return record


class Progress:
    """A tqdm bar with the few numbers a person watches."""

    def __init__(self, cfg: Config, start: int):
        from tqdm import tqdm

        self.bar = tqdm(total=cfg.run.max_steps, initial=start, disable=not cfg.run.progress, unit="step",
                        dynamic_ncols=True, file=sys.stderr)
        self.acc = None

    def update(self, step: int, m: dict) -> None:
        self.acc = m.get("eval/accuracy", self.acc)
        post = {"reward": f"{m.get('reward/mean', 0):.3f}", "acc": "-" if self.acc is None else f"{self.acc:.2f}",
                "len": f"{m.get('length/mean', 0):.1f}", "ent": f"{m.get('policy/entropy_mean', 0):.2f}",
                "s/step": f"{m.get('time/step_s', 0):.2f}"}
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(step - self.bar.n)

    def write(self, text: str) -> None:
        self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()


def resume_config(run_dir: str, overrides: list[str]) -> Config:
    """The run's saved config with new overrides on top (e.g. a larger max_steps)."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"cannot resume: {path} does not exist (is {run_dir!r} a grpoplus run directory?)")
    saved = yaml.safe_load(path.read_text())
    return build_config(overrides=overrides, base=saved)
