"""grpoplus speed benchmarks (reported as measured numbers and ratios, never asserted in tests).

    python benchmarks/bench.py default [--steps 12]   # the default run: s/step by stage, tok/s, peak memory
    python benchmarks/bench.py vs-trl  [--steps 20]   # side by side with TRL's GRPOTrainer, same model/task
    python benchmarks/bench.py health-overhead [--steps 12] [--rounds 3]   # the preflight, guard and traces' cost

``default`` runs the default training (the main job) (preset dapo, task arithmetic, built-in model) for a
few steps and prints the median seconds per step split into rollout / reward / learner, rollout and
learner tokens per second, and the process's peak resident memory.

``vs-trl`` runs TRL's GRPOTrainer (``benchmarks/trl_peer.py``) and grpoplus on the same ~2.4M-parameter
Llama, the same arithmetic prompts, 32 completions of 8 tokens per optimizer step, one thread each,
in alternating subprocesses, and prints both medians and the throughput ratio.

``--record [DIR]`` stores the figures of ``default`` or ``vs-trl`` as a record (:mod:`records`), which
``docs/results/vs-trl.md`` renders (:data:`VIEWS`).

``health-overhead`` runs ``default`` in alternating subprocesses with the run's safety nets as they are by default
(the preflight before step 1, the health guard each step, a rollout trace of every step) and with all three off
(``health.preflight_prompts=0 health.warn=false run.traces=false``), and prints each call's wall time of the whole
``train`` call per step and its median step time, and the median ratio of the pairs (on / off).
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
from pathlib import Path

from records import add_record_argument, store

HERE = Path(__file__).resolve().parent


def _median(records: list[dict], key: str) -> float | None:
    values = [r[key] for r in records if key in r]
    return round(statistics.median(values), 4) if values else None


def run_default(steps: int, extra: list[str]) -> dict:
    from grpoplus.config import build_config
    from grpoplus.loop.driver import train

    with tempfile.TemporaryDirectory() as out:
        cfg = build_config("dapo", overrides=[f"out={out}", f"max_steps={steps}", "eval_every=0", "save_every=0",
                                              "progress=false", "loggers=[]", "doctor_every=0", *extra])
        t0 = time.perf_counter()
        records = train(cfg)
        wall = time.perf_counter() - t0
        records = [r for r in records if r["step"] > 1 and r["step"] < steps]  # skip warm-up and final eval
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    keys = ["time/step_s", "time/rollout_s", "time/reward_s", "time/learner_s",
            "throughput/rollout_tok_s", "throughput/learner_tok_s", "sampling/rounds", "length/mean"]
    return {"bench": "default", "steps_measured": len(records), **{k: _median(records, k) for k in keys},
            "train_wall_s": round(wall, 2), "peak_rss_mb": round(peak_mb, 1)}


HEALTH_OFF = ["health.preflight_prompts=0", "health.warn=false", "run.traces=false"]


def run_health_overhead(steps: int, rounds: int, extra: list[str]) -> dict:
    """The default run with its preflight, guard and traces (on) and without (off), alternated."""
    calls = {"on": [], "off": []}
    for _ in range(rounds):
        for arm, overrides in (("on", extra), ("off", [*extra, *HEALTH_OFF])):
            out = subprocess.run([sys.executable, __file__, "default", *overrides, f"--steps={steps}"],
                                 capture_output=True, text=True, check=True).stdout
            calls[arm].append(json.loads(out.strip().splitlines()[-1]))
    wall = {arm: [c["train_wall_s"] / steps for c in runs] for arm, runs in calls.items()}
    return {"bench": "health-overhead", "steps": steps, "rounds": rounds,
            "wall_s_per_step": wall, "step_s_median": {arm: [c["time/step_s"] for c in runs] for arm, runs in
                                                       calls.items()},
            "ratio_on_over_off": round(statistics.median(a / b for a, b in zip(wall["on"], wall["off"])), 4)}


def grpoplus_peer(steps: int, warmup: int, threads: int) -> dict:
    """grpoplus on TRL's benchmark task: same model, prompts, 4 x 8 completions of <= 8 tokens."""
    sys.path.insert(0, str(HERE))
    import torch
    from trl_peer import peer_model  # noqa: E402 (benchmarks/ is not a package)

    from grpoplus.config import build_config
    from grpoplus.loop.driver import train
    from grpoplus.models.tokenizer import char_tokenizer

    torch.set_num_threads(threads)
    tok = char_tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "peer"
        peer_model(tok).save_pretrained(model_dir)
        tok.save_pretrained(model_dir)
        cfg = build_config("grpo", overrides=[
            f"out={tmp}/run", f"model={model_dir}", f"max_steps={steps}", "beta=0", "num_minibatches=1",
            "prompts_per_step=4", "group_size=8", "max_new_tokens=8", "lr=1e-4", "eval_every=0", "save_every=0",
            "eval_size=1", "eval_samples=0", "progress=false", "loggers=[]", "doctor_every=0",
            f"threads={threads}", "warmup_steps=0",
            "health.stop_after=0"])  # the untrained peer model's rewards never differ: time the steps anyway
        records = [r for r in train(cfg) if warmup < r["step"] < steps]
    return {"peer": "grpoplus", "completions_per_step": 32, "max_new_tokens": 8, "threads": threads,
            "steps_measured": len(records), "median_s_per_step": _median(records, "time/step_s")}


def run_vs_trl(steps: int, warmup: int, rounds: int, threads: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    ours_cmd = [sys.executable, __file__, "_grpoplus_peer", f"--steps={steps}", f"--warmup={warmup}",
                f"--threads={threads}"]
    trl_cmd = [sys.executable, str(HERE / "trl_peer.py"), f"--steps={steps}", f"--warmup={warmup}",
               f"--threads={threads}"]
    ours, theirs = [], []
    for _ in range(rounds):  # alternate so machine drift hits both alike
        for cmd, sink in ((trl_cmd, theirs), (ours_cmd, ours)):
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
            sink.append(json.loads(out.strip().splitlines()[-1])["median_s_per_step"])
    ratio = statistics.median(t / o for t, o in zip(theirs, ours))
    return {"bench": "vs-trl", "trl_s_per_step": theirs, "grpoplus_s_per_step": ours,
            "throughput_ratio_grpoplus_over_trl": round(ratio, 2)}


def vs_trl_table(figures: dict) -> str:
    """The results page's table of a ``vs-trl`` record: each side's s/step per alternated run, and the ratio."""
    runs = range(1, len(figures["trl_s_per_step"]) + 1)
    lines = ["| | " + " | ".join(f"run {k}" for k in runs) + " |", "|---|" + "---:|" * len(runs)]
    for side, key in (("TRL `GRPOTrainer` s/step", "trl_s_per_step"), ("grpoplus s/step", "grpoplus_s_per_step")):
        lines.append(f"| {side} | " + " | ".join(f"{v:.3f}" for v in figures[key]) + " |")
    lines.append(f"| grpoplus's steps/s over TRL's (median of the runs' ratios) | "
                 f"**{figures['throughput_ratio_grpoplus_over_trl']:.2f}x** |" + " |" * (len(runs) - 1))
    return "\n".join(lines)


def default_table(figures: dict) -> str:
    """The results page's table of a ``default`` record: the median step by stage, tokens/s and peak memory."""
    def at(key: str, fmt: str) -> str:
        return "" if figures.get(key) is None else format(figures[key], fmt)

    return "\n".join([
        "| seconds per step | rollout | reward | learner | rollout tokens/s | learner tokens/s | rounds drawn | "
        "peak memory |", "|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {at('time/step_s', '.3f')} | {at('time/rollout_s', '.3f')} | {at('time/reward_s', '.3f')} | "
        f"{at('time/learner_s', '.3f')} | {at('throughput/rollout_tok_s', ',.0f')} | "
        f"{at('throughput/learner_tok_s', ',.0f')} | {at('sampling/rounds', '.1f')} | {figures['peak_rss_mb']:,.0f} MB |"])


VIEWS = {"vs_trl": vs_trl_table, "default": default_table}
"""What a page renders from a record (``benchmarks/render.py``)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["default", "vs-trl", "health-overhead", "_grpoplus_peer"])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="vs-trl, health-overhead: alternating runs of each side")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("overrides", nargs="*", help="default: extra key=value config overrides")
    add_record_argument(parser, "default, vs-trl")
    args = parser.parse_args()
    if args.which == "default":
        result = run_default(args.steps or 12, args.overrides)
    elif args.which == "health-overhead":
        result = run_health_overhead(args.steps or 12, args.rounds, args.overrides)
    elif args.which == "vs-trl":
        result = run_vs_trl(args.steps or 20, args.warmup, args.rounds, args.threads)
    else:
        result = grpoplus_peer(args.steps or 20, args.warmup, args.threads)
    print(json.dumps(result))
    if args.which in ("default", "vs-trl"):
        store(f"bench_{args.which.replace('-', '_')}", result, args.record)


if __name__ == "__main__":
    main()
