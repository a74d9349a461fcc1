"""Scale-out on one machine: synchronous vs asynchronous rollouts, and learner scaling with data parallelism.

Every run is ``grpoplus train`` on the default task (arithmetic, the built-in warm-started
model, the dapo preset) in its own process, one after the other, with the load average
recorded around each. Printed as JSON lines, then a summary:

- staleness: ``max_staleness`` 0 (the synchronous loop), 1 and 2 with the same steps and
  seed: steps per second (evaluation excluded), and held-out accuracy at equal wall time,
  read from each run's evaluations at the longest wall time all runs reached;
- data_parallel: 1 vs 2 learner ranks on the same batches (2 ranks train exactly like one):
  seconds of learner work per step and the scaling efficiency ``t1 / (2 t2)``.

    python benchmarks/scale.py                      # defaults: 40 steps, eval every 10 on 100 prompts
    python benchmarks/scale.py --steps 100 --eval-size 200 --parts staleness
    python benchmarks/scale.py --extra cluster=ray rollout.workers=2    # the same on a local Ray instance

``python benchmarks/records.py scale "python benchmarks/scale.py ..."`` stores what it prints as a record, which
``docs/results/scaling.md`` renders (:data:`VIEWS`).

On a shared or small machine the sampler thread and the learner compete for the same cores:
quote the load with the figures, and re-run on a quiet machine with more cores to see the overlap.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(out: Path, steps: int, eval_every: int, eval_size: int, overrides: list[str]) -> dict:
    """One ``grpoplus train`` in a subprocess; its metrics, wall time and the load around it."""
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "grpoplus", "train", "--out", str(out), f"max_steps={steps}",
           f"eval_every={eval_every}", f"eval_size={eval_size}", "save_every=0", "progress=false", "loggers=[]",
           "doctor_every=0", "overwrite=true", *overrides]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(overrides)} failed:\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"records": records, "wall_s": time.perf_counter() - t0, "load_before": load_before,
            "load_after": os.getloadavg()}


def train_seconds(records: list[dict]) -> float:
    """Seconds of training steps, evaluation excluded."""
    return sum(r["time/step_s"] - r.get("time/eval_s", 0.0) for r in records if r["step"] > 0)


def accuracy_at(records: list[dict], wall_s: float) -> float:
    """Held-out accuracy of the last evaluation done within ``wall_s`` of training time."""
    best = records[0]["eval/accuracy"]
    for r in records[1:]:
        if r["time/elapsed_s"] <= wall_s + 1e-9 and "eval/accuracy" in r:
            best = r["eval/accuracy"]
    return best


def staleness(args, root: Path) -> dict:
    runs = {k: run(root / f"staleness{k}", args.steps, args.eval_every, args.eval_size,
                   [f"max_staleness={k}", *args.extra]) for k in (0, 1, 2)}
    common = min(r["records"][-1]["time/elapsed_s"] for r in runs.values())
    out = {}
    for k, r in runs.items():
        recs = r["records"]
        trained = [x for x in recs if x["step"] > 0]
        out[f"max_staleness={k}"] = {
            "steps_per_s": round(len(trained) / train_seconds(recs), 3),
            "accuracy_at_equal_wall_time": accuracy_at(recs, common), "equal_wall_time_s": round(common, 1),
            "final_accuracy": recs[-1]["eval/accuracy"],
            "staleness_mean": round(statistics.mean(x.get("async/staleness_mean", 0.0) for x in trained), 2),
            "learner_busy_frac": round(statistics.mean(x.get("async/learner_busy_frac", 1.0) for x in trained), 2),
            "load_before_after": [round(r["load_before"][0], 2), round(r["load_after"][0], 2)]}
        print(json.dumps({"part": "staleness", **out[f"max_staleness={k}"], "run": f"max_staleness={k}"}), flush=True)
    base = out["max_staleness=0"]["steps_per_s"]
    for k in (1, 2):
        out[f"max_staleness={k}"]["speedup_vs_sync"] = round(out[f"max_staleness={k}"]["steps_per_s"] / base, 3)
    return out


def data_parallel(args, root: Path) -> dict:
    runs = {n: run(root / f"dp{n}", args.dp_steps, 0, args.eval_size,
                   [f"data_parallel={n}", f"micro_batch_size={args.dp_micro}", *args.extra]) for n in (1, 2)}
    out = {}
    for n, r in runs.items():
        trained = [x for x in r["records"] if x["step"] > 0]
        out[f"data_parallel={n}"] = {"learner_s_per_step": round(statistics.median(x["time/learner_s"] for x in trained), 3),
                                     "load_before_after": [round(r["load_before"][0], 2), round(r["load_after"][0], 2)]}
        print(json.dumps({"part": "data_parallel", "run": f"data_parallel={n}", **out[f"data_parallel={n}"]}), flush=True)
    t1, t2 = out["data_parallel=1"]["learner_s_per_step"], out["data_parallel=2"]["learner_s_per_step"]
    out["scaling_efficiency"] = round(t1 / (2 * t2), 3)
    return out


def _printed(figures: dict, part: str) -> list[dict]:
    return [v for call in figures["calls"] for v in call["printed"] if v.get("part") == part]


def staleness_table(figures: dict) -> str:
    """The results page's staleness table from a record of this benchmark (:func:`records.run_recorded`)."""
    rows = _printed(figures, "staleness")
    base = rows[0]["steps_per_s"]
    lines = [f"| setting | steps/s | vs synchronous | held-out accuracy at {rows[0]['equal_wall_time_s']} s | "
             "final accuracy | mean staleness | learner busy | load before / after |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| `{r['run']}` | {r['steps_per_s']:.2f} | {r['steps_per_s'] / base:.2f}x | "
              f"{r['accuracy_at_equal_wall_time']:.3f} | {r['final_accuracy']:.3f} | {r['staleness_mean']:.2f} | "
              f"{r['learner_busy_frac']:.2f} | {r['load_before_after'][0]:.2f} / {r['load_before_after'][1]:.2f} |"
              for r in rows]
    return "\n".join(lines)


def data_parallel_table(figures: dict) -> str:
    """The results page's learner-scaling table from a record of this benchmark."""
    rows = _printed(figures, "data_parallel")
    t1 = rows[0]["learner_s_per_step"]
    lines = ["| learner ranks | learner s/step (median) | scaling efficiency `t1 / (n tn)` |", "|---|---:|---:|"]
    lines += [f"| `{r['run']}` | {r['learner_s_per_step']:.3f} | "
              f"{t1 / (int(r['run'].split('=')[1]) * r['learner_s_per_step']):.2f} |" for r in rows]
    return "\n".join(lines)


VIEWS = {"staleness": staleness_table, "data_parallel": data_parallel_table}
"""What a page renders from a record (``benchmarks/render.py``)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="steps per staleness run")
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-size", type=int, default=100)
    parser.add_argument("--dp-steps", type=int, default=10, help="steps per data-parallel run")
    parser.add_argument("--dp-micro", type=int, default=16,
                        help="micro_batch_size of both data-parallel runs (each rank takes whole micro-batches)")
    parser.add_argument("--parts", nargs="+", default=["staleness", "data_parallel"])
    parser.add_argument("--extra", nargs="*", default=[], help="key=value overrides for every run")
    args = parser.parse_args()
    machine = {"cpus": len(os.sched_getaffinity(0)), "uname": " ".join(os.uname()[2:5])}
    print(json.dumps({"machine": machine, "args": vars(args)}), flush=True)
    summary = {}
    with tempfile.TemporaryDirectory(prefix="grpoplus-scale-") as root:
        for part in args.parts:
            summary[part] = {"staleness": staleness, "data_parallel": data_parallel}[part](args, Path(root))
    print(json.dumps({"summary": summary}, indent=1))


if __name__ == "__main__":
    main()
