"""The training loop. Each step runs the stages in the order the data flows:

    collect (prompts -> rollouts -> scored groups) -> prepare (-> TrainBatch)
    -> update (optimizer steps) -> sync (learner weights -> engine) -> step metrics

and the loop around it evaluates, checkpoints, logs and resumes. Nothing algorithmic
lives here: the stages are in grpoplus.collect, grpoplus.learner and grpoplus.algo.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpoplus.assemble import Components, assemble
from grpoplus.assemble.learner import RANK_BUILDERS
from grpoplus.config import Config
from grpoplus.containers import LearnerTrace, ScoredGroups
from grpoplus.core.rundir import RunDir
from grpoplus.distributed.local import follow_torchrun, torchrun_follower
from grpoplus.learner import checkpoint as ckpt
from grpoplus.loop.evaluation import evaluate
from grpoplus.loop.preflight import Preflight, check_rewards
from grpoplus.metrics import LiveDoctor, MetricsWriter, batch_info_from_config, read_metrics
from grpoplus.metrics.guard import GuardPlan, HealthGuard, HealthStop
from grpoplus.metrics.step import entropy_metrics, rollout_metrics
from grpoplus.metrics.traces import TraceWriter
from grpoplus.metrics.writer import truncate_jsonl
from grpoplus.models.memory import give_back_freed_memory
from grpoplus.plan import resolve, write_plan_files
from grpoplus.plan.loop import LoopPlan


@dataclass
class StepOutput:
    """What one step hands to the loop: its metrics, the groups to log samples of, and what the learner made of them
    (None: it trained on nothing)."""

    metrics: dict
    groups: ScoredGroups
    learned: LearnerTrace | None = None


def train_step(c: Components, step: int) -> tuple[dict, ScoredGroups]:
    """One rollout batch through every stage. Returns (step metrics, the groups to log samples of)."""
    out = run_step(c, step)
    return out.metrics, out.groups


def run_step(c: Components, step: int) -> StepOutput:
    """One rollout batch through every stage."""
    collected = c.collector.next(step)
    if c.plan.loop.release_memory:
        give_back_freed_memory()  # what the rollout freed, before the learner allocates (the learner's
        # ranks give back what their update freed themselves: grpoplus.distributed.learner.update_step)
    metrics = dict(collected.metrics)
    if collected.sampled:
        metrics.update(rollout_metrics(collected.drawn, collected.batch))
    if collected.batch is None:  # every group had zero spread: nothing to train on this step
        metrics.update({"optim/skipped_updates": 0.0, "time/learner_s": 0.0})
        c.learner.publish(version=step)  # versions count steps, trained on or not (bounded staleness relies on it)
        return StepOutput(metrics, collected.drawn[-1])
    t0 = time.perf_counter()
    c.engine.offload()  # GPU engines free their memory for the update; sync_weights brings them back
    result = c.learner.learn(collected.batch, step)  # prepare + optimizer steps, on every learner rank
    c.learner.publish(version=step)
    learner_s = time.perf_counter() - t0
    response_mask = collected.batch.rollouts.response_mask
    trained = float(response_mask.sum())
    drawn = sum(float(s.rollouts.response_mask.sum()) for s in collected.drawn)
    metrics.update(result.metrics)
    if collected.sampled:
        metrics.update(entropy_metrics(result.entropy, collected.batch.rollouts.sampled_mask))  # the policy's tokens
    metrics.update({"time/learner_s": learner_s,
                    "throughput/learner_tok_s": trained * c.plan.loop.updates_per_batch / max(learner_s, 1e-9),
                    "throughput/rollout_tok_s": drawn / max(metrics["time/rollout_s"], 1e-9)})
    return StepOutput(metrics, collected.batch, result.trace)


def run_eval(c: Components, step: int) -> dict:
    """Held-out accuracy on the task (greedy and sampled); a supervised stage's held-out demonstrations' loss too
    (``eval/loss``), and its accuracy only with ``sft.eval_accuracy``."""
    metrics = {}
    if c.demos is not None and c.demos.held_out:
        from grpoplus.sft.collect import held_out_loss

        metrics["eval/loss"] = held_out_loss(c.learner.parts.policy, c.demos.held_out, c.tokenizer.pad_token_id,
                                             c.learner.plan)
    if c.demos is None or c.plan.loop.eval_accuracy:
        e = c.plan.eval
        metrics.update(evaluate(c.engine, c.task, c.test, max_new_tokens=e.max_new_tokens, temperature=e.temperature,
                                top_p=e.top_p, samples=e.samples, ks=e.ks, seed=c.plan.seed * 7919 + step,
                                episodes=c.collect_plan.episodes))
    return metrics


def trainer_state(c: Components, step: int, counters: dict) -> dict:
    """The loop's part of a checkpoint (the learner adds its optimizer and scheduler)."""
    return {"step": step, **c.collector.position(), "rng": ckpt.rng_state(), "counters": dict(counters)}


def restore(c: Components, path: Path) -> tuple[int, dict]:
    state = c.learner.load(path)  # weights, optimizer, scheduler, reference: on every learner rank
    c.collector.load(state)
    ckpt.set_rng_state(state["rng"])
    c.learner.publish(version=state["step"])
    return state["step"], state["counters"]


def train(cfg: Config, resume: bool = False, callbacks: Sequence[Callable[[dict], Any]] = ()) -> list[dict]:
    """Run (or resume) training; returns the metric records written by this call. Each callback is called with
    each step's record; one that returns True stops the run after that step (its checkpoint written)."""
    plan = resolve(cfg)
    if torchrun_follower(plan.placement.ranks):  # under torchrun every rank runs this; ranks > 0 only take part in updates
        follow_torchrun(plan.learner, RANK_BUILDERS)
        return []
    run_dir = RunDir(plan.loop.out)
    if not resume:
        run_dir.clear(plan.loop.overwrite)
    run_dir.root.mkdir(parents=True, exist_ok=True)
    c = assemble(plan)
    try:
        start, counters = _start(c, run_dir, resume)
        cfg.save(run_dir.config)
        write_plan_files(run_dir.plan, plan)
        print_inert_notice(plan.loop)
        if start == 0:
            for line in preflight(c).findings:
                print(f"preflight: {line}", file=sys.stderr)
        return _loop(c, run_dir, start, counters, resumed=start > 0, callbacks=callbacks)
    finally:
        c.close()


EVAL_FILE = "eval.json"
"""What ``grpoplus eval`` writes into its run directory: the held-out metrics and what they measured."""


def evaluate_only(cfg: Config) -> dict:
    """The held-out evaluation a run makes at step 0 (``run_eval``), alone: the model as ``learner.model`` names it,
    nothing trained; written to ``RUN/eval.json`` and returned."""
    import json

    plan = resolve(cfg)
    if plan.placement.ranks > 1:
        raise ValueError("grpoplus eval runs in one process: drop learner.data_parallel (it trains nothing)")
    c = assemble(plan)
    try:
        metrics = run_eval(c, 0)
    finally:
        c.close()
    loop = plan.loop
    record = {"model": loop.model, "task": loop.task, "examples": len(c.test), "seed": plan.seed,
              **{k: float(v) for k, v in sorted(metrics.items())}}
    out = Path(loop.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / EVAL_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return record


def preflight(c: Components) -> Preflight:
    """The rewards on real completions of the first training prompts, before step 1 (:mod:`grpoplus.loop.preflight`); a
    supervised stage has no rewards to check (its plan asks for no preflight)."""
    loop = c.plan.loop
    if not loop.preflight_prompts:
        return Preflight()
    return check_rewards(c, loop.preflight_prompts, c.plan.seed)


def check_only(cfg: Config) -> int:
    """``grpoplus train --check``: assemble the run (every data row read, every prompt measured against the model's
    context) and call the rewards once on real completions, training nothing and writing nothing; prints what it
    checked and each finding, one line each; 1 when there is a finding, else 0."""
    plan = resolve(cfg)
    c = assemble(plan)
    try:
        report = preflight(c)
        facts = [f"data: {len(c.train)} training and {len(c.test)} held-out prompts"
                 + "".join(f", {k} {int(v)}" for k, v in c.data_metrics.items() if v)]
        for line in facts + report.facts:
            print(f"check: {line}")
        for line in report.findings:
            print(f"check: finding: {line}")
    finally:
        c.close()
    print(f"check: {len(report.findings)} finding(s)" if report.findings else "check: ok: nothing found that stops "
          "the run or makes it learn nothing")
    return 1 if report.findings else 0


def print_inert_notice(loop: LoopPlan) -> None:
    """One stderr line naming the configured switches that cannot act in this run (AlgoConfig.inert_switches)."""
    inert = loop.inert_switches
    if inert:
        print(f"note: {', '.join(inert)} cannot act: with one optimizer step per rollout batch the policy at the "
              "update is pi_old, so the ratio is exactly 1; set algo.num_minibatches > 1 (or num_iterations > 1, "
              "or learner.logp_old=rollout) to make them act", file=sys.stderr)


def _start(c: Components, run_dir: RunDir, resume: bool) -> tuple[int, dict]:
    """(first step, counters): from the newest complete checkpoint when resuming, else from scratch."""
    latest = ckpt.latest_checkpoint(run_dir.root) if resume else None
    if latest is not None:
        start, counters = restore(c, latest)
        print(f"resuming from {latest} (step {start})", file=sys.stderr)
        return start, counters
    if resume:
        print(f"no complete checkpoint in {run_dir.root}: starting from step 0", file=sys.stderr)
        run_dir.clear(overwrite=True)  # what was logged before the first checkpoint is redone
    return 0, {"skipped_total": 0.0, "elapsed_s": 0.0}


def _loop(c: Components, run_dir: RunDir, start: int, counters: dict, resumed: bool,
          callbacks: Sequence[Callable[[dict], Any]] = ()) -> list[dict]:
    truncate_jsonl(run_dir.samples, start)
    loop = c.plan.loop
    traces = TraceWriter(run_dir.traces, sys.maxsize if loop.traces < 0 else loop.traces, loop.traces_max_bytes,
                         resume_step=start)
    writer = MetricsWriter(run_dir.root, loggers=list(loop.loggers), resume_step=start if resumed else None,
                           config=c.plan.record())
    info = batch_info_from_config(c.plan.record())
    doctor = LiveDoctor(batch_info=info, every=loop.doctor_every)
    records = []
    history = read_metrics(run_dir.root) if resumed else []  # the steps before this call, for the doctor
    guard = HealthGuard(GuardPlan(warn=loop.health_warn, stop_after=loop.health_stop_after), info, history)
    progress = Progress(loop, start)
    try:
        if start == 0:
            records.append(log(writer, 0, {**c.data_metrics, **run_eval(c, 0)}))
            history.append(records[-1])
            _notify(callbacks, records[-1])
            progress.update(0, records[-1])
        for step in range(start + 1, loop.max_steps + 1):
            t0 = time.perf_counter()
            out = run_step(c, step)
            metrics = out.metrics
            last = step == loop.max_steps
            if last or (loop.eval_every and step % loop.eval_every == 0):
                metrics.update(run_eval(c, step))
            counters["skipped_total"] += metrics.get("optim/skipped_updates", 0.0)
            counters["elapsed_s"] += time.perf_counter() - t0
            metrics.update({"optim/skipped_total": counters["skipped_total"], "time/elapsed_s": counters["elapsed_s"],
                            "time/step_s": time.perf_counter() - t0})
            records.append(log(writer, step, metrics))
            history.append(records[-1])
            stop = _notify(callbacks, records[-1])
            for line in guard.observe(step, records[-1]):
                progress.write(line)
            stop = stop or guard.stop_reason is not None
            run_dir.write_samples(step, out.groups, loop.log_samples)
            traces.write(step, out.groups, out.learned)
            if last or stop or (loop.save_every and step % loop.save_every == 0):
                c.learner.save(run_dir.root, step, c.tokenizer, trainer_state(c, step, counters),
                               keep=loop.keep_checkpoints)
            progress.update(step, metrics)
            if doctor.due(step):
                for finding in doctor.check(history):
                    progress.write(f"doctor: {finding.one_line()}")
            if stop:
                if guard.stop_reason is None:
                    progress.write(f"stopped by a callback after step {step}")
                break
    finally:
        progress.close()
        writer.close()
    if guard.stop_reason is not None:
        raise HealthStop(f"{guard.stop_reason}; checkpoint {ckpt.latest_checkpoint(run_dir.root)} (grpoplus doctor "
                         f"{run_dir.root} says more; grpoplus train --resume {run_dir.root} continues it)")
    if loop.progress:
        for line in closing_lines(history, run_dir.root):
            print(line, file=sys.stderr)
    return records


def closing_lines(history: list[dict], run: Path) -> list[str]:
    """What a finished run says last: held-out accuracy from its first evaluation to its last, where its newest
    checkpoint is, and what to run next."""
    evals = [(int(r["step"]), r["eval/accuracy"]) for r in history if "eval/accuracy" in r]
    lines = []
    if evals:
        (s0, a0), (s1, a1) = evals[0], evals[-1]
        lines.append(f"grpoplus: held-out accuracy {a0:.1%} (step {s0}) -> {a1:.1%} (step {s1})")
    latest = ckpt.latest_checkpoint(run)
    if latest is not None:
        lines.append(f"grpoplus: checkpoint {latest} (grpoplus export {run} --out DIR: a Hugging Face model dir)")
    lines.append(f"grpoplus: next: grpoplus report {run} (curves and samples), grpoplus doctor {run} (run health)")
    return lines


def _notify(callbacks: Sequence[Callable[[dict], Any]], record: dict) -> bool:
    """Every callback sees the record (a copy each); True when one asks to stop."""
    return any([callback(dict(record)) is True for callback in callbacks])


def log(writer, step: int, metrics: dict) -> dict:
    record = {"step": step, **{k: float(v) for k, v in sorted(metrics.items())}}
    writer.log(step, record)
    return record


class Progress:
    """A tqdm bar with the few numbers a person watches."""

    def __init__(self, loop: LoopPlan, start: int):
        from tqdm import tqdm

        self.bar = tqdm(total=loop.max_steps, initial=start, disable=not loop.progress, unit="step",
                        dynamic_ncols=True, file=sys.stderr)
        self.acc = None

    def update(self, step: int, m: dict) -> None:
        self.acc = m.get("eval/accuracy", self.acc)
        if "loss/nll" in m or "sft/demos" in m:  # a supervised stage: its loss, not rewards
            self.bar.set_postfix({"loss": f"{m.get('loss/nll', 0):.3f}", "acc": "-" if self.acc is None else
                                  f"{self.acc:.2f}", "s/step": f"{m.get('time/step_s', 0):.2f}"}, refresh=False)
            self.bar.update(step - self.bar.n)
            return
        post = {"reward": f"{m.get('reward/mean', 0):.3f}", "acc": "-" if self.acc is None else f"{self.acc:.2f}",
                "len": f"{m.get('length/mean', 0):.1f}", "ent": f"{m.get('policy/entropy_mean', 0):.2f}",
                "s/step": f"{m.get('time/step_s', 0):.2f}"}
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(step - self.bar.n)

    def write(self, text: str) -> None:
        self.bar.write(text, file=sys.stderr)

    def close(self) -> None:
        self.bar.close()
