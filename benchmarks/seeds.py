"""A training command on several seeds: what a results page quotes of a run's learning, as a stored record.

Each seed runs ``grpoplus train ARGS --seed S`` in its own process, one after the other, with a cold warm-start
cache (``GRPOPLUS_CACHE`` a fresh folder per seed, so each builds its warm start as a new user's first run does).
Per seed it keeps every evaluation's figures (``eval/*``), the training records' ``--train-keys`` (the mean of the
first and of the last ``--window`` steps), the warm start's seconds, the median step and the whole run's wall time.
``--show KEY=LABEL`` names the evaluation figures a page's table shows (``%`` after the label: as a percentage)::

    python benchmarks/seeds.py guess --seeds 0 1 2 --record \\
        --show "eval/accuracy=held-out games solved (greedy)%" "eval/accuracy_sampled=solved (sampled)%" \\
        "eval/turns_mean=turns per game (greedy)" --train-keys reward/mean env/turns_mean \\
        -- --preset dapo --task guess max_steps=80 eval_every=10

``docs/results/multi-turn.md`` renders its records (:data:`VIEWS`, :data:`PLOTS`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from records import add_record_argument, store
from train_runs import cold_seed, parse_with_train_args


def run_seed(seed: int, folder: Path, args: list[str], train_keys: list[str], window: int) -> dict:
    """One seed's run and its figures."""
    rows, warm, wall = cold_seed(args, folder / f"run-{seed}", seed)
    trained = [r for r in rows if r.get("step", 0) > 0 and "time/step_s" in r]

    def mean(part: list[dict], key: str) -> float | None:
        values = [r[key] for r in part if key in r]
        return round(statistics.fmean(values), 4) if values else None

    return {"seed": seed,
            "evals": {str(r["step"]): {k: round(v, 4) for k, v in r.items() if k.startswith("eval/")}
                      for r in rows if any(k.startswith("eval/") for k in r)},
            "train_first": {k: mean(trained[:window], k) for k in train_keys},
            "train_last": {k: mean(trained[-window:], k) for k in train_keys},
            "window": window, "warm_start_s": warm,
            "median_step_s": round(statistics.median(r["time/step_s"] for r in trained), 3) if trained else None,
            "rl_s": round(sum(r["time/step_s"] for r in trained), 1), "wall_s": round(wall, 1)}


def _shown(figures: dict) -> list[tuple[str, str, bool]]:
    """(key, label, as a percentage) of each figure the tables show."""
    return [(key, label.rstrip("%"), label.endswith("%")) for key, label in figures["show"]]


def _cell(value: float, percent: bool) -> str:
    return f"{100 * value:.1f}%" if percent else f"{value:.2f}"


def evals_table(figures: dict) -> str:
    """Per evaluated step: each shown figure's mean over the seeds, each seed's in brackets."""
    shown, seeds = _shown(figures), figures["seeds"]
    lines = ["| step | " + " | ".join(label for _, label, _ in shown) + " |", "|---:|" + "---:|" * len(shown)]
    for step in sorted({int(s) for seed in seeds for s in seed["evals"]}):
        cells = []
        for key, _, percent in shown:
            values = [seed["evals"].get(str(step), {}).get(key) for seed in seeds]
            known = [v for v in values if v is not None]
            cells.append("" if not known else f"{_cell(statistics.fmean(known), percent)} (" +
                         ", ".join("-" if v is None else _cell(v, percent).rstrip("%") for v in values) + ")")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def seeds_table(figures: dict) -> str:
    """Per seed: the first shown figure at the first and last evaluation, the training keys over the first and last
    steps, the warm start's and RL's seconds."""
    (key, label, percent), *_ = _shown(figures)
    keys = [k for k in figures["train_keys"]]
    lines = ["| seed | " + f"{label}, first -> last evaluation | " +
             "".join(f"`{k}`, first -> last {figures['window']} steps | " for k in keys) +
             "warm start s | RL s | median step s |", "|---:|---:|" + "---:|" * (len(keys) + 3)]
    for seed in figures["seeds"]:
        steps = sorted(seed["evals"], key=int)
        first, last = seed["evals"][steps[0]][key], seed["evals"][steps[-1]][key]
        train = "".join(f"{seed['train_first'][k]:.3g} -> {seed['train_last'][k]:.3g} | " for k in keys)
        lines.append(f"| {seed['seed']} | {_cell(first, percent)} -> {_cell(last, percent)} | {train}"
                     f"{seed['warm_start_s'] if seed['warm_start_s'] is not None else '-'} | {seed['rl_s']:.0f} | "
                     f"{seed['median_step_s']:.2f} |")
    return "\n".join(lines)


def curves_plot(figures: dict) -> dict:
    """The first shown figure by step, one curve per seed (:mod:`plots`)."""
    (key, label, percent), *_ = _shown(figures)
    steps = sorted({int(s) for seed in figures["seeds"] for s in seed["evals"]})
    return {"kind": "lines", "title": f"{figures['title']}: {label} by RL step", "x": steps, "xlabel": "step",
            "unit": label + (" (%)" if percent else ""),
            "series": {f"seed {seed['seed']}": [round((100 if percent else 1) * seed["evals"][str(k)][key], 2)
                                                for k in steps] for seed in figures["seeds"]}}


VIEWS = {"evals": evals_table, "seeds": seeds_table}
"""What a page renders from a record (``benchmarks/render.py``)."""
PLOTS = {"curves": curves_plot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--show", nargs="+", default=["eval/accuracy=held-out accuracy (greedy)%"],
                        help="KEY=LABEL of each evaluation figure the tables show (LABEL ending in %%: a percentage)")
    parser.add_argument("--train-keys", nargs="*", default=[], help="training metrics averaged over the first and "
                                                                     "last --window steps")
    parser.add_argument("--window", type=int, default=5)
    parser.add_argument("--title", default=None, help="the plot's title (default: the task)")
    add_record_argument(parser)
    parser.add_argument("name", help="the record's name: seeds_NAME")
    args, command = parse_with_train_args(parser)
    with tempfile.TemporaryDirectory() as tmp:
        seeds = []
        for seed in args.seeds:
            seeds.append(run_seed(seed, Path(tmp), command, args.train_keys, args.window))
            print(json.dumps(seeds[-1]), flush=True)
    task = next((command[i + 1] for i, word in enumerate(command[:-1]) if word == "--task"), "the job")
    figures = {"train": command, "show": [s.split("=", 1) for s in args.show], "train_keys": args.train_keys,
               "window": args.window, "title": args.title or task, "seeds": seeds}
    store(f"seeds_{args.name}", figures, args.record)


if __name__ == "__main__":
    main()
