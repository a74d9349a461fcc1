"""QLoRA against LoRA and full fine-tuning on SmolLM2-135M: peak memory, seconds per step, and the first steps' trend.

    python benchmarks/qlora.py [--model smollm2] [--steps 4] [--warmup 1] [--threads 1] [--record] [key=value ...]

Three variants, one after another, each in its own process so that its peak resident memory (``ru_maxrss``) is
its own: full fine-tuning, LoRA (``learner.lora_rank=16``, fp32) and QLoRA (the same adapters on an nf4 base,
``learner.quantize=nf4``). Each trains ``--steps`` steps of the dapo preset on the wordproblems task with the
setup of ``smollm2_vs_trl.py`` (4 prompts x 4 samples of <= 48 new tokens, one update per batch, no dynamic
sampling or overlong shaping), the rewards and difficulty of ``docs/how-to/real-model.md`` (the answer-line format
at 0.2 beside the verifier, difficulty 1: a reward that moves within a few steps), the learning rate 1e-5 of that
page for full fine-tuning and 10x it for the adapters (Schulman et al. 2025, "LoRA Without Regret"); the
``key=value`` overrides apply to all three (e.g. ``gradient_checkpointing=true release_memory=eager``). Each
process prints one JSON line: its seconds per step after ``--warmup`` steps (wall: median, range; rollout and
learner medians; and the process's CPU seconds, steadier on a shared machine), its resident memory once built and
its peak, and per step the mean reward (both components), the policy loss and the sampler/learner mismatch
``mismatch/k3``. Then a table of the three, with each one's ratios to LoRA. ``--threads``: torch threads per
process (1 by default, with ``OMP_WAIT_POLICY=PASSIVE``: on cores other work shares, more threads spin at every
barrier).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from records import add_record_argument, store

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded

PROMPTS, GROUP, NEW_TOKENS = 4, 4, 48
VARIANTS = {"full": ["lr=1e-5"], "lora": ["lora_rank=16", "lr=1e-4"], "qlora": ["lora_rank=16", "lr=1e-4", "quantize=nf4"]}
"""The variants and their overrides; ratios are taken against ``lora``."""


def rss_mb() -> float:
    """The resident memory of this process now (Linux)."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def cpu_s() -> float:
    """CPU seconds this process has used (user + system, every thread)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_variant(variant: str, model: str, steps: int, warmup: int, threads: int, overrides: list[str]) -> dict:
    """One variant in this process: its record (see the module docstring)."""
    from grpoplus.assemble import assemble
    from grpoplus.config import build_config
    from grpoplus.loop.driver import train_step
    from grpoplus.models.memory import give_back_freed_memory
    from grpoplus.plan import resolve

    cfg = build_config("dapo", overrides=[
        f"model={model}", "task=wordproblems", "difficulty=1", "rewards=[task,gsm8k_format:0.2]",
        f"prompts_per_step={PROMPTS}", f"group_size={GROUP}",
        f"max_new_tokens={NEW_TOKENS}", "dynamic_sampling=false", "overlong_shaping=false", "num_minibatches=1",
        "warmup_steps=0", "lr_schedule=constant", f"max_steps={steps}", "eval_every=0", "save_every=0",
        f"out={tempfile.mkdtemp(prefix='grpoplus-qlora-bench-')}", "progress=false", "loggers=[]", "doctor_every=0",
        f"threads={threads}", *VARIANTS[variant], *overrides])
    c = assemble(resolve(cfg))
    give_back_freed_memory()  # what loading freed (a GGUF's de-quantised copy) is not counted as held
    built_rss, built_peak = rss_mb(), peak_rss_mb()
    times, cpu, steps_seen = [], [], []
    try:
        for step in range(1, steps + 1):
            t0, c0 = time.perf_counter(), cpu_s()
            metrics, _ = train_step(c, step)
            times.append(time.perf_counter() - t0)
            cpu.append(cpu_s() - c0)
            steps_seen.append({k: metrics.get(k) for k in ("reward/mean", "loss/policy", "mismatch/k3",
                                                           "time/rollout_s", "time/learner_s")})
    finally:
        c.close()
    kept = list(zip(times, steps_seen))[warmup:] or list(zip(times, steps_seen))
    return {"variant": variant, "overrides": " ".join(overrides), "steps": steps, "warmup": warmup, "threads": threads,
            "s_per_step_median": round(statistics.median(t for t, _ in kept), 2),
            "s_per_step_min": round(min(t for t, _ in kept), 2), "s_per_step_max": round(max(t for t, _ in kept), 2),
            "cpu_s_per_step_median": round(statistics.median(cpu[warmup:] or cpu), 2),
            "rollout_s_median": round(statistics.median(s["time/rollout_s"] for _, s in kept), 2),
            "learner_s_median": round(statistics.median(s["time/learner_s"] for _, s in kept), 2),
            "built_rss_mb": round(built_rss), "built_peak_rss_mb": round(built_peak), "peak_rss_mb": round(peak_rss_mb()),
            "reward_per_step": [round(s["reward/mean"], 3) for s in steps_seen],
            "policy_loss_per_step": [round(s["loss/policy"], 4) for s in steps_seen],
            "mismatch_k3_max": max(abs(s["mismatch/k3"]) for s in steps_seen)}


def table(records: list[dict]) -> str:
    """The records side by side, with each one's ratios to LoRA's step time and peak memory."""
    lora = next(r for r in records if r["variant"] == "lora")
    lines = ["| variant | s/step median (range) | CPU s/step | rollout s | learner s | RSS built / peak (MB) | "
             "CPU s vs LoRA | peak vs LoRA | reward per step | max mismatch/k3 |", "|---" * 10 + "|"]
    for r in records:
        lines.append(f"| {r['variant']} | {r['s_per_step_median']} ({r['s_per_step_min']}-{r['s_per_step_max']}) | "
                     f"{r['cpu_s_per_step_median']} | {r['rollout_s_median']} | {r['learner_s_median']} | "
                     f"{r['built_rss_mb']} / {r['peak_rss_mb']} | "
                     f"{r['cpu_s_per_step_median'] / lora['cpu_s_per_step_median']:.2f}x | "
                     f"{r['peak_rss_mb'] / lora['peak_rss_mb']:.2f}x | {', '.join(map(str, r['reward_per_step']))} | "
                     f"{r['mismatch_k3_max']:.1e} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="steps left out of the timing")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--variant", choices=list(VARIANTS), help="run this variant alone, in this process")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides for every variant")
    add_record_argument(parser)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args.variant, args.model, args.steps, args.warmup, args.threads, args.overrides)))
        return
    records = []
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), OMP_WAIT_POLICY="PASSIVE")
    for variant in VARIANTS:  # one at a time: the machine's cores go to one run
        cmd = [sys.executable, __file__, f"--variant={variant}", f"--model={args.model}", f"--steps={args.steps}",
               f"--warmup={args.warmup}", f"--threads={args.threads}", *args.overrides]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        records.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(records[-1]), flush=True)
    print(table(records))
    store("qlora", {"overrides": args.overrides, "steps": args.steps, "warmup": args.warmup, "threads": args.threads,
                    "variants": records}, args.record)


def memory_plot(figures: dict) -> dict:
    """Each variant's resident memory once built and at its peak (:mod:`plots`)."""
    extra = " ".join(figures["overrides"])
    return {"kind": "bars", "title": "SmolLM2-135M: resident memory per variant" + (f" ({extra})" if extra else ""),
            "unit": "MB", "labels": [r["variant"] for r in figures["variants"]],
            "series": {"once built": [r["built_rss_mb"] for r in figures["variants"]],
                       "peak": [r["peak_rss_mb"] for r in figures["variants"]]}}


VIEWS = {"table": lambda figures: table(figures["variants"])}
"""What a page renders from a record (``benchmarks/render.py``)."""
PLOTS = {"memory": memory_plot}


if __name__ == "__main__":
    main()
