"""The driver's loop, as the config decides it: how many steps, when it evaluates, saves, checks its health and
logs, and where (:class:`LoopPlan`). :mod:`grpoplus.loop.driver` runs from it and reads no config."""

from __future__ import annotations

from dataclasses import dataclass

from grpoplus.config import Config


@dataclass(frozen=True, kw_only=True)
class LoopPlan:
    """What the driver's loop is told (its components come from the assembly)."""

    stage: str  # rl | sft
    out: str  # the run directory
    overwrite: bool  # a run directory holding another run's outputs is emptied (else refused)
    max_steps: int
    eval_every: int  # 0: at step 0 and the last step only
    eval_accuracy: bool  # a supervised stage's evaluation samples answers too (sft.eval_accuracy)
    save_every: int
    keep_checkpoints: int
    log_samples: int  # completions per step in samples.jsonl
    traces: int  # trained samples per step written to RUN/traces (-1: every one, 0: none)
    traces_max_bytes: int
    loggers: tuple[str, ...]
    progress: bool
    doctor_every: int
    health_warn: bool
    health_stop_after: int
    preflight_prompts: int  # 0: no preflight (a supervised stage has no rewards to check)
    release_memory: bool  # the rollout's freed memory goes back to the system before the update
    updates_per_batch: int  # algo.num_iterations: passes over each batch (the learner's tokens/s counts them)
    inert_switches: tuple[str, ...]  # configured switches that cannot act in this run (AlgoConfig.inert_switches)
    model: str  # what the run trains, as eval.json names it
    task: str  # the data it trains on, as eval.json names it


def loop_plan(cfg: Config) -> LoopPlan:
    run, health = cfg.run, cfg.health
    # a supervised stage writes none: its rows are demonstrations, with no sampler log-probs or advantages
    traces = 0 if run.stage == "sft" else -1 if run.traces is True else int(run.traces)
    return LoopPlan(
        stage=run.stage, out=str(run.out), overwrite=run.overwrite, max_steps=run.max_steps,
        eval_every=run.eval_every, eval_accuracy=cfg.sft.eval_accuracy, save_every=run.save_every,
        keep_checkpoints=run.keep_checkpoints, log_samples=run.log_samples, traces=traces,
        traces_max_bytes=int(run.traces_max_mb * 2**20), loggers=tuple(run.loggers), progress=run.progress,
        doctor_every=run.doctor_every, health_warn=health.warn, health_stop_after=health.stop_after,
        preflight_prompts=health.preflight_prompts if run.stage == "rl" else 0,
        release_memory=run.release_memory != "off", updates_per_batch=cfg.algo.num_iterations,
        inert_switches=tuple(cfg.algo.inert_switches(pi_old_is_sampler=cfg.learner.logp_old == "rollout")),
        model=cfg.learner.model or "built-in tiny model", task=cfg.data.data or cfg.data.task)
