"""Checks that run the trainer itself on the device: a checkpoint written and resumed continues bit for bit, and
a short main job (the built-in arithmetic task, DAPO) raises held-out accuracy."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from grpoplus.config import build_config, resumed_config
from grpoplus.learner.checkpoint import latest_checkpoint
from grpoplus.loop.driver import train
from grpoplus.selftest.runner import CheckFailed, Context, check

QUIET = ["progress=false", "loggers=[]", "doctor_every=0", "log_samples=0"]
MAIN_JOB_STEPS, QUICK_STEPS = 60, 30
MIN_GAIN = 0.05
"""Held-out accuracy must rise by this much in the main job's steps. On the 2-core CPU the default job (seeds 0-2)
gained 7 to 17 points by step 50-75 (docs/results/demo.md); 30 steps of the quick size only need to rise."""


def _config(ctx: Context, run: Path, steps: int, *extra: str):
    return build_config("dapo", overrides=[f"out={run}", f"device={ctx.device}", f"max_steps={steps}", *QUIET, *extra])


def _comparable(record: dict) -> dict:
    """A step's metrics less its timings (which differ from run to run)."""
    return {k: v for k, v in record.items() if not k.startswith(("time/", "throughput/"))}


def _weights(run: Path) -> dict[str, torch.Tensor]:
    files = sorted(latest_checkpoint(run).glob("*.safetensors"))
    return {k: v for f in files for k, v in load_file(f).items()}


@check("checkpoint_resume", "trainer",
       "a run stopped at a checkpoint and resumed on the device ends bit for bit like the uninterrupted one "
       "(metrics and weights)")
def checkpoint_resume(ctx: Context) -> dict:
    small = ["prompts_per_step=4", "group_size=4", "max_new_tokens=12", "eval_size=8", "eval_every=0",
             "eval_samples=0", "save_every=2", "num_minibatches=2"]
    whole, part = ctx.scratch / "whole", ctx.scratch / "part"
    records = train(_config(ctx, whole, 4, *small))
    train(_config(ctx, part, 2, *small))
    resumed = train(resumed_config(part, ["max_steps=4"]), resume=True)
    ours, theirs = [_comparable(r) for r in records[-2:]], [_comparable(r) for r in resumed[-2:]]
    if [r["step"] for r in theirs] != [3, 4]:
        raise CheckFailed(f"the resumed run logged steps {[r['step'] for r in resumed]}, not 3 and 4")
    differ = sorted({k for a, b in zip(ours, theirs) for k in a if a[k] != b.get(k) and a[k] == a[k]})
    a, b = _weights(whole), _weights(part)
    moved = [k for k in a if not torch.equal(a[k], b[k])]
    if differ or moved:
        raise CheckFailed(f"resumed run differs from the uninterrupted one: {len(differ)} metrics "
                          f"({', '.join(differ[:3])}) and {len(moved)} weight tensors ({', '.join(moved[:2])})")
    return {"metrics_compared": sum(len(r) for r in ours), "tensors_compared": len(a)}


@check("main_job", "trainer",
       "60 steps of the main job (built-in arithmetic task, DAPO) raise held-out accuracy by at least 5 points "
       "(--quick: 30 steps, any rise)")
def main_job(ctx: Context) -> dict:
    steps = QUICK_STEPS if ctx.quick else MAIN_JOB_STEPS
    size = ["prompts_per_step=16", "eval_size=100"] if ctx.quick else []
    records = train(_config(ctx, ctx.scratch / "main", steps, f"eval_every={steps}", "eval_samples=0", "save_every=0",
                            *size))
    before, after = records[0]["eval/accuracy"], records[-1]["eval/accuracy"]
    gain = MIN_GAIN if not ctx.quick else 1e-6
    step_s = sorted(r["time/step_s"] for r in records[1:])[len(records[1:]) // 2]
    figures = {"steps": steps, "accuracy_before": before, "accuracy_after": after, "median_step_s": round(step_s, 3)}
    if not after - before >= gain - 1e-6:
        raise CheckFailed(f"held-out accuracy went {before:.3f} -> {after:.3f} in {steps} steps (expected a rise of at "
                          f"least {gain:.2f})")
    return figures
