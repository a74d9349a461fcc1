"""The main job on several seeds: what docs/results/demo.md quotes.

Each seed runs README's main job as a new user does, ``grpoplus train --preset dapo --task arithmetic --out DIR
--seed S``, with a cold warm-start cache (``GRPOPLUS_CACHE`` a fresh folder per seed, so each builds its warm start),
one after the other. Per seed: held-out accuracy (greedy), sampled pass@1 and pass@4, and the greedy response length
at steps 0, 50, 100, 200 and 300; the warm start's seconds, the median step's and the whole run's. ``--record [DIR]``
stores the figures as a record (:mod:`records`)::

    python benchmarks/demo.py --seeds 0 1 2 --record

About 8 minutes per seed on a 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from records import add_record_argument, store
from train_runs import cold_seed

STEPS = (0, 50, 100, 200, 300)
"""The steps the page's table shows (the job evaluates every 25)."""
KEYS = {"greedy": "eval/accuracy", "sampled": "eval/accuracy_sampled", "pass1": "eval/pass@1",
        "pass4": "eval/pass@4", "length": "eval/length_mean"}


def run_seed(seed: int, folder: Path, extra: list[str]) -> dict:
    """One seed's main job, its figures."""
    rows, warm, wall = cold_seed(["--preset", "dapo", "--task", "arithmetic", *extra], folder / f"demo-{seed}", seed)
    evals = {r["step"]: r for r in rows if KEYS["greedy"] in r}
    steps = [r["time/step_s"] for r in rows if "time/step_s" in r]
    return {"seed": seed,
            "curve": {str(step): {name: round(evals[step][key], 4) for name, key in KEYS.items()}
                      for step in STEPS if step in evals},
            "warm_start_s": warm,
            "median_step_s": round(statistics.median(steps), 3) if steps else None,
            "wall_s": round(wall, 1)}


def summary(seeds: list[dict]) -> dict:
    """Per table step and figure: the mean over the seeds and the range."""
    out = {}
    for step in STEPS:
        shown = [s["curve"][str(step)] for s in seeds if str(step) in s["curve"]]
        if shown:
            out[str(step)] = {name: {"mean": round(statistics.fmean(v[name] for v in shown), 4),
                                     "min": min(v[name] for v in shown), "max": max(v[name] for v in shown)}
                              for name in KEYS}
    return out


def table(figures: dict) -> str:
    """The page's table (docs/results/demo.md) from a record's figures: per step, the mean over the seeds and the
    range in brackets."""
    def shown(cell: dict, percent: bool) -> str:
        if percent:
            return f"{100 * cell['mean']:.1f}% ({100 * cell['min']:.1f}–{100 * cell['max']:.1f})"
        return f"{cell['mean']:.1f} ({cell['min']:.1f}–{cell['max']:.1f})"

    lines = ["| step | held-out accuracy (greedy) | sampled pass@1 | pass@4 | greedy response length |",
             "|---:|---:|---:|---:|---:|"]
    for step, row in figures["summary"].items():
        lines.append(f"| {step} | {shown(row['greedy'], True)} | {shown(row['sampled'], True)} | "
                     f"{shown(row['pass4'], True)} | {shown(row['length'], False)} |")
    return "\n".join(lines)


def seed_lines(figures: dict) -> list[str]:
    """Each seed's line on the page: held-out accuracy at the first and last step, greedy length, and times."""
    out = []
    for s in figures["seeds"]:
        first, last = s["curve"][min(s["curve"], key=int)], s["curve"][max(s["curve"], key=int)]
        out.append(f"| {s['seed']} | {100 * first['greedy']:.1f}% -> {100 * last['greedy']:.1f}% "
                   f"({100 * (last['greedy'] - first['greedy']):+.1f}) | {first['length']:.1f} -> {last['length']:.1f} | "
                   f"{s['warm_start_s']} | {s['median_step_s']:.2f} | {s['wall_s'] / 60:.1f} |")
    return out


def seed_table(figures: dict) -> str:
    """The page's per-seed table: :func:`seed_lines` under their header."""
    return "\n".join(["| seed | held-out accuracy (greedy), step 0 -> 300 | greedy length | warm start (s) | "
                      "median step (s) | wall (min) |", "|---:|---:|---:|---:|---:|---:|", *seed_lines(figures)])


def curves_plot(figures: dict) -> dict:
    """Held-out greedy accuracy by step, one curve per seed (:mod:`plots`)."""
    steps = [int(s) for s in figures["summary"]]
    return {"kind": "lines", "title": "The main job: held-out accuracy (greedy) by RL step",
            "x": steps, "xlabel": "step", "unit": "held-out accuracy (%)",
            "series": {f"seed {s['seed']}": [round(100 * s["curve"][str(k)]["greedy"], 1) for k in steps]
                       for s in figures["seeds"]}}


VIEWS = {"table": table, "seeds": seed_table}
"""What a page renders from a record (``benchmarks/render.py``)."""
PLOTS = {"curves": curves_plot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    add_record_argument(parser)
    parser.add_argument("extra", nargs="*", help="config overrides passed to every run (e.g. max_steps=50)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        seeds = []
        for seed in args.seeds:
            seeds.append(run_seed(seed, Path(tmp), args.extra))
            print(json.dumps(seeds[-1]), flush=True)
    figures = {"seeds": seeds, "summary": summary(seeds)}
    print(json.dumps({"summary": figures["summary"]}))
    store("demo", figures, args.record)


if __name__ == "__main__":
    main()
