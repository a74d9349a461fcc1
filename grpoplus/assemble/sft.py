"""A supervised stage's demonstrations and collector (run.stage=sft): from ``sft.demos``, from ``sft.demo_model``'s
samples of the task's training prompts (off-policy distillation, kept in the run directory so a resumed stage trains
on the same ones), or from a built-in task's worked answers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from grpoplus.containers import SamplingParams
from grpoplus.plan.run import RunPlan
from grpoplus.sft.builtin import BUILTIN_DEMOS, builtin_rows
from grpoplus.sft.collect import DemoCollector
from grpoplus.sft.demos import Demo
from grpoplus.sft.source import DemoSet, cut_count, file_demos, rows_demos, split_held_out, task_demos

TEACHER_DEMOS = "teacher_demos.jsonl"
"""In the run directory: sft.demo_model's demonstrations as ids (written once; a resumed stage reads them back)."""
TEACHER_STATS = "teacher_demos.json"
"""Beside them: how many responses sft.demo_model wrote and how many were correct."""


def build_demos(plan: RunPlan, task, train: list, tokenizer) -> DemoSet:
    """The stage's demonstrations, split into training and held-out ones (``sft.eval_demos``)."""
    s = plan.sft
    skipped: list[tuple[int, str]] = []
    source_correct = None
    if s.demos in BUILTIN_DEMOS:
        demos = rows_demos(builtin_rows(s.demos, s.task, train), tokenizer, s.max_length)
    elif s.demos is not None:
        demos, skipped = file_demos(s.demos, tokenizer, s.messages_field, s.max_length, s.on_bad_row)
    elif s.demo_model is not None:
        demos, source_correct = teacher_demos(plan, task, train, tokenizer)
    else:
        demos = task_demos(task, train, tokenizer, s.direct_frac, plan.seed, s.max_length)
    for _, reason in skipped[:3]:
        print(f"grpoplus sft: skipped {reason}", file=sys.stderr)
    if len(skipped) > 3:
        print(f"grpoplus sft: skipped {len(skipped)} demonstrations in all", file=sys.stderr)
    kept, held_out = split_held_out(demos, s.eval_demos, plan.seed)
    return DemoSet(kept, held_out, skipped, cut_count(demos, s.max_length), source_correct)


def demo_collector(plan: RunPlan, demos: DemoSet, tokenizer) -> DemoCollector:
    constants = {} if demos.source_correct is None else {"sft/demo_model_correct_frac": demos.source_correct}
    return DemoCollector(demos.train, plan.sft.demos_per_step, tokenizer.pad_token_id, plan.seed, constants)


def teacher_demos(plan: RunPlan, task, train: list, tokenizer) -> tuple[list[Demo], float]:
    """``sft.demo_model``'s responses to the training prompts (``sft.demo_samples`` each, sampled as the rollouts
    are: rollout.temperature, top_p, max_new_tokens), those the task's verifier accepts (``sft.demo_filter=correct``)
    or all, with the share that was correct; read back from the run directory when an earlier call of this stage
    wrote them."""
    s, out = plan.sft, Path(plan.loop.out)
    saved, stats = out / TEACHER_DEMOS, out / TEACHER_STATS
    if saved.is_file() and stats.is_file():
        return ([Demo(tuple(r["prompt"]), tuple(r["response"]), tuple(r["trained"]))
                 for r in map(json.loads, saved.read_text().splitlines())],
                json.loads(stats.read_text())["correct_frac"])
    rollouts = sample_teacher(plan, train, tokenizer)
    correct = verdicts(task, train, rollouts, s.demo_samples)
    keep = [i for i in range(len(correct)) if correct[i] or s.demo_filter == "all"]
    if not keep:
        raise ValueError(f"sft.demo_model={s.demo_model!r} answered none of the {len(train)} training prompts "
                         "correctly: keep its answers anyway with sft.demo_filter=all, or use a stronger model")
    demos = [teacher_demo(rollouts, i) for i in keep]
    saved.parent.mkdir(parents=True, exist_ok=True)
    stats.write_text(json.dumps({"responses": len(correct), "correct": sum(correct),
                                 "correct_frac": sum(correct) / len(correct)}) + "\n")
    saved.write_text("".join(json.dumps({"prompt": list(d.prompt), "response": list(d.response),
                                         "trained": list(d.trained)}) + "\n" for d in demos))  # last: marks them whole
    print(f"grpoplus sft: {s.demo_model} wrote {len(correct)} responses, {sum(correct)} correct; training on "
          f"{len(demos)} ({saved})", file=sys.stderr)
    return demos, sum(correct) / len(correct)


def sample_teacher(plan: RunPlan, train: list, tokenizer):
    """The demonstration model's rollouts of every training prompt, in batches, with the run's seed."""
    from grpoplus.assemble.factories import build_engine
    from grpoplus.teacher import check_vocabulary
    from grpoplus.teacher.load import load_model

    s, r = plan.sft, plan.collection
    check_vocabulary(s.demo_model, tokenizer)
    model, _ = load_model(s.demo_model, plan.placement.device, s.task, s.difficulty)
    engine = build_engine(plan.rollout.engine, model, tokenizer, plan.rollout.process.seed)
    params = SamplingParams(n=s.demo_samples, temperature=r.temperature, top_p=r.top_p,
                            max_new_tokens=r.max_new_tokens, seed=plan.seed)
    generator = torch.Generator().manual_seed(plan.seed)
    parts = []
    try:
        for start in range(0, len(train), r.prompts_per_step):
            chunk = train[start:start + r.prompts_per_step]
            parts.append(engine.generate([ex.prompt for ex in chunk], params, list(range(start, start + len(chunk))),
                                         generator))
    finally:
        engine.close()
    from grpoplus.containers import Rollouts

    return Rollouts.concat(parts, tokenizer.pad_token_id)


def verdicts(task, train: list, rollouts, samples: int) -> list[bool]:
    """The task verifier's verdict on every sampled response (groups of ``samples`` rows per training prompt)."""
    from grpoplus.tasks.base import is_correct, reward_fields

    examples = [train[i // samples] for i in range(len(rollouts.texts))]
    scores = task.reward([ex.prompt for ex in examples], rollouts.texts, **reward_fields(examples))
    return [is_correct(s) for s in scores]


def teacher_demo(rollouts, i: int) -> Demo:
    """Row ``i`` of the teacher's rollouts as a demonstration (its sampled tokens trained on)."""
    prompt = rollouts.prompt_ids[i][rollouts.prompt_mask[i].bool()].tolist()
    n = int(rollouts.response_mask[i].sum())
    response = rollouts.response_ids[i, :n].tolist()
    trained = rollouts.sampled_mask[i, :n].long().tolist()
    return Demo(tuple(prompt), tuple(response), tuple(trained))
