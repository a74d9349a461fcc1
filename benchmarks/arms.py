"""Settings of one training command side by side: what a results page quotes of their cost, as a stored record.

Each arm is ``grpoplus train ARGS`` with its own overrides, in its own process; the arms alternate, round after
round, so a machine's drift hits them alike. Per call: the median over the steps after ``--warmup`` of each
``--keys`` metric (default: the step's and the learner's seconds) and the process's wall time::

    python benchmarks/arms.py teacher_cost --rounds 2 --record \\
        --arm "no teacher=" --arm "opd=teacher=smollm2 lambda_opd=0.1" \\
        --arm "gkd=teacher=smollm2 distill_loss=reverse_kl" \\
        -- --preset grpo --model smollm2 --task wordproblems prompts_per_step=4 group_size=4 max_new_tokens=48 \\
        micro_batch_size=8 max_steps=4 eval_every=0 eval_size=4 eval_samples=0

``docs/results/distillation.md`` renders its record (:data:`VIEWS`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import tempfile
from pathlib import Path

from records import add_record_argument, store
from train_runs import parse_with_train_args, train

KEYS = ("time/step_s", "time/learner_s")


def run_arm(args: list[str], overrides: list[str], out: Path, keys: list[str], warmup: int) -> dict:
    """One call: the medians of ``keys`` over the steps after ``warmup``, and its wall seconds."""
    rows, _, wall = train([*args, *overrides, "progress=false"], out)
    kept = [r for r in rows if r.get("step", 0) > warmup and "time/step_s" in r]
    return {k: round(statistics.median(r[k] for r in kept), 3) for k in keys if any(k in r for r in kept)} | {
        "steps": len(kept), "wall_s": round(wall, 1)}


def arms_table(figures: dict) -> str:
    """Per arm and key: each round's median, and the change against the first arm in the same round."""
    keys, arms = figures["keys"], figures["arms"]
    base = arms[0]["calls"]
    lines = ["| arm | " + " | ".join(f"`{k}` per round" for k in keys) + " |", "|---|" + "---:|" * len(keys)]
    for arm in arms:
        cells = []
        for key in keys:
            values = [c.get(key) for c in arm["calls"]]
            shown = " / ".join("-" if v is None else f"{v:.2f}" for v in values)
            if arm is not arms[0] and all(v is not None and b.get(key) for v, b in zip(values, base)):
                changes = [100 * (v / b[key] - 1) for v, b in zip(values, base)]
                shown += f" ({min(changes):+.0f} to {max(changes):+.0f}%)" if len(changes) > 1 else \
                    f" ({changes[0]:+.0f}%)"
            cells.append(shown)
        name = f"`{arm['overrides']}`" if arm["overrides"] else arm["name"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


VIEWS = {"table": arms_table}
"""What a page renders from a record (``benchmarks/render.py``)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", help="the record's name: arms_NAME")
    parser.add_argument("--arm", action="append", required=True, help="NAME=OVERRIDES (space-separated key=value)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians")
    parser.add_argument("--keys", nargs="+", default=list(KEYS))
    add_record_argument(parser)
    args, command = parse_with_train_args(parser)
    arms = [{"name": a.split("=", 1)[0], "overrides": a.split("=", 1)[1] if "=" in a else "", "calls": []}
            for a in args.arm]
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for k, arm in enumerate(arms):
                call = run_arm(command, shlex.split(arm["overrides"]), Path(tmp) / f"{k}-{round_}", args.keys,
                               args.warmup)
                arm["calls"].append(call)
                print(json.dumps({"arm": arm["name"], "round": round_, **call}), flush=True)
    figures = {"train": command, "keys": args.keys, "warmup": args.warmup, "rounds": args.rounds, "arms": arms}
    store(f"arms_{args.name}", figures, args.record)


if __name__ == "__main__":
    main()
