"""The visual task learns on a CPU: the built-in tiny vision-language model warm-started on ``shapes``, then RL.

Per seed, as a user runs it (the CLI, in subprocesses, one at a time):

1. ``grpoplus sft --task shapes --model tiny-vlm learner.train_vision=true max_steps=25 ...``: a short supervised
   warm start (its vision tower trains too: it starts random) on the task's answers, half of them worked cell by
   cell (``x..x#2``), half the count alone (``#2``), leaving the policy barely trained;
2. ``grpoplus train --task shapes --model SFT/checkpoints/step-25 max_steps=150 eval_every=50``: GRPO (the
   defaults, the vision tower frozen) from that checkpoint.

Figures per seed: held-out accuracy (128 pictures the warm start never saw), greedy and sampled (one completion per
picture at the run's temperature), before and after RL, the curves every 50 steps, and each stage's wall seconds.
The target (issue 47): accuracy up by at least 20 points on each of 3 seeds within 15 minutes of RL on a 2-core
CPU. ``--warm-steps``, ``--rl-steps`` and ``--eval-every`` change the recipe; ``--record [DIR]`` stores the figures
as a record (:mod:`records`)::

    python benchmarks/shapes_vlm.py --seeds 0 1 2 --record
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from records import add_record_argument, store

WARM_STEPS, RL_STEPS, EVAL_EVERY, EVAL = 25, 150, 50, 128


def sft_args(warm_steps: int) -> list[str]:
    return ["learner.train_vision=true", f"max_steps={warm_steps}", "demos_per_step=32", "lr=3e-3", "warmup_steps=10",
            "lr_schedule=constant", f"eval_every={warm_steps}", f"eval_size={EVAL}", f"save_every={warm_steps}",
            "progress=false"]


def rl_args(rl_steps: int, eval_every: int) -> list[str]:
    return [f"max_steps={rl_steps}", f"eval_every={eval_every}", f"eval_size={EVAL}", "progress=false"]


def run(args: list[str]) -> float:
    """One CLI call; its wall seconds (a failure stops the benchmark with its output)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "grpoplus", *args], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"grpoplus {' '.join(args)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return time.perf_counter() - started


def curve(run_dir: Path, key: str = "eval/accuracy") -> list[tuple[int, float]]:
    """(step, held-out accuracy) of every evaluation of a run: greedy (``eval/accuracy``) or sampled
    (``eval/accuracy_sampled``)."""
    rows = (json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines())
    return [(r["step"], round(r[key], 4)) for r in rows if key in r]


def seed_figures(seed: int, folder: Path, sft: list[str], rl_: list[str], warm_steps: int) -> dict:
    warm, rl = folder / f"sft-{seed}", folder / f"rl-{seed}"
    sft_s = run(["sft", "--task", "shapes", "--model", "tiny-vlm", "--out", str(warm), f"seed={seed}", *sft])
    rl_s = run(["train", "--task", "shapes", "--model", str(warm / "checkpoints" / f"step-{warm_steps}"),
                "--out", str(rl), f"seed={seed}", *rl_])
    greedy, sampled = curve(rl), curve(rl, "eval/accuracy_sampled")
    return {"seed": seed, "greedy_before": greedy[0][1], "greedy_after": greedy[-1][1],
            "greedy_gain_points": round(100 * (greedy[-1][1] - greedy[0][1]), 1),
            "sampled_before": sampled[0][1], "sampled_after": sampled[-1][1],
            "sampled_gain_points": round(100 * (sampled[-1][1] - sampled[0][1]), 1),
            "greedy_curve": greedy, "sampled_curve": sampled, "sft_s": round(sft_s, 1), "rl_s": round(rl_s, 1)}


def seed_table(figures: dict) -> str:
    """The results page's table (docs/results/vision.md): per seed, greedy and sampled accuracy before and after
    RL, and each stage's seconds."""
    def moved(row: dict, which: str) -> str:
        return (f"{100 * row[which + '_before']:.1f}% -> {100 * row[which + '_after']:.1f}% "
                f"({row[which + '_gain_points']:+.1f})")

    lines = ["| seed | greedy: before RL -> after | sampled: before RL -> after | warm start s | RL s |",
             "|---:|---|---|---:|---:|"]
    lines += [f"| {r['seed']} | {moved(r, 'greedy')} | {moved(r, 'sampled')} | {r['sft_s']:.1f} | {r['rl_s']:.1f} |"
              for r in figures["seeds"]]
    return "\n".join(lines)


def curves_plot(figures: dict) -> dict:
    """Held-out accuracy by RL step, greedy and sampled, per seed (:mod:`plots`)."""
    steps = [step for step, _ in figures["seeds"][0]["greedy_curve"]]
    series = {f"seed {r['seed']} {which}": [round(100 * acc, 1) for _, acc in r[f"{which}_curve"]]
              for r in figures["seeds"] for which in ("greedy", "sampled")}
    return {"kind": "lines", "title": "shapes on tiny-vlm: held-out accuracy by RL step", "x": steps,
            "xlabel": "RL step", "unit": "held-out accuracy (%)", "series": series,
            "color": {name: k // 2 for k, name in enumerate(series)}, "dashed": [n for n in series if "sampled" in n]}


VIEWS = {"table": seed_table}
"""What a page renders from a record (``benchmarks/render.py``)."""
PLOTS = {"curves": curves_plot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--warm-steps", type=int, default=WARM_STEPS, help="supervised warm-start steps")
    parser.add_argument("--rl-steps", type=int, default=RL_STEPS)
    parser.add_argument("--eval-every", type=int, default=EVAL_EVERY, help="RL steps between held-out evaluations")
    add_record_argument(parser)
    args = parser.parse_args()
    sft, rl = sft_args(args.warm_steps), rl_args(args.rl_steps, args.eval_every)
    with tempfile.TemporaryDirectory(prefix="grpoplus-shapes-") as folder:
        rows = []
        for seed in args.seeds:
            rows.append(seed_figures(seed, Path(folder), sft, rl, args.warm_steps))
            print(json.dumps(rows[-1]), flush=True)
    within = all(r["rl_s"] <= 900 for r in rows)
    summary = {"min_greedy_gain_points": min(r["greedy_gain_points"] for r in rows),
               "min_sampled_gain_points": min(r["sampled_gain_points"] for r in rows),
               "max_rl_s": max(r["rl_s"] for r in rows), "target": "gain >= 20 points on every seed, RL within 900 s",
               "met_greedy": within and all(r["greedy_gain_points"] >= 20 for r in rows),
               "met_sampled": within and all(r["sampled_gain_points"] >= 20 for r in rows)}
    print(json.dumps(summary))
    store("shapes_vlm", {"seeds": rows, "summary": summary, "sft": sft, "rl": rl}, args.record)


if __name__ == "__main__":
    main()
