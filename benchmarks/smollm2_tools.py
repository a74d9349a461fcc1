"""SmolLM2-135M-Instruct learning to use the calculator: a supervised warm start on the project's own tool-call
demonstrations, then RL with the tool, against RL from the plain instruct model and the warm start alone.

Each seed runs three arms on the ``wordproblems`` task with ``tools=[calculator]`` and prints one JSON line per arm
with its held-out greedy accuracy, the share of held-out trajectories that called the tool, and its wall time:

- ``sft``: ``grpoplus sft --demos wordproblems-calculator`` (each training problem solved with one calculator call
  per worked step, then the answer line);
- ``sft+rl``: ``grpoplus train --model <the sft checkpoint>`` with the calculator (24 steps of 4 x 4 trajectories,
  lr 1e-5, the settings in ``RL_EXTRA``: dynamic sampling, one update per batch, a KL term to the warm start);
- ``rl``: ``grpoplus train --model smollm2`` with the calculator, the same RL settings.

Every evaluation is greedy on the same 128 held-out problems of the seed's split.

::

    python benchmarks/smollm2_tools.py --seeds 0 1 2 --out runs/tools
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

TOOLS = ["--task", "wordproblems", "tools=[calculator]", "max_turns=5", "max_new_tokens=40", "eval_samples=0",
         "progress=false", "loggers=[]", "overwrite=true"]
# the dapo preset's token-mean loss and dynamic sampling (up to 3 rounds until 4 groups whose rewards differ), one
# update per batch of 16 trajectories (4 x 4) with a KL term to the model the stage starts from (beta 0.04: the warm
# start, for sft+rl); no length shaping (a trajectory's turns add up past max_new_tokens). Before: no dynamic sampling
# (dynamic_sampling=false), and before that also two updates per batch and no KL (num_minibatches=2 beta=0)
RL_EXTRA = ["dynamic_sampling=true", "overlong_shaping=false", "num_minibatches=1", "beta=0.04"]


def run(args: list[str], log: Path) -> float:
    """One grpoplus command, its output into ``log``; returns its wall time."""
    started = time.perf_counter()
    with log.open("w") as handle:
        done = subprocess.run([sys.executable, "-m", "grpoplus", *args], stdout=handle, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"{' '.join(args)} failed (exit {done.returncode}): see {log}")
    return time.perf_counter() - started


def final(run_dir: Path) -> dict:
    """The last evaluation of a run: held-out accuracy, tool-call share, tool errors, and the first evaluation's."""
    evals = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "eval/accuracy" in r]
    keys = ("eval/accuracy", "eval/tool_call_frac", "eval/tool_errors", "eval/turns_mean", "eval/loss")
    return {"step": evals[-1]["step"], **{k: evals[-1][k] for k in keys if k in evals[-1]},
            "accuracy_before": evals[0]["eval/accuracy"], "tool_call_frac_before": evals[0].get("eval/tool_call_frac")}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path("runs/tools"))
    parser.add_argument("--sft-steps", type=int, default=15)
    parser.add_argument("--rl-steps", type=int, default=24)
    parser.add_argument("--rl-preset", default="dapo")
    parser.add_argument("--rl-lr", default="1e-5")
    parser.add_argument("--rl-extra", nargs="*", default=RL_EXTRA, help="more key=value words for both RL arms")
    parser.add_argument("--eval-size", type=int, default=128, help="held-out problems of every arm's evaluations")
    parser.add_argument("--arms", nargs="+", default=["sft", "sft+rl", "rl"])
    a = parser.parse_args(argv)
    rl = ["--preset", a.rl_preset, "prompts_per_step=4", "group_size=4", f"lr={a.rl_lr}", f"max_steps={a.rl_steps}",
          "eval_every=0", "save_every=0", f"eval_size={a.eval_size}", *a.rl_extra]
    for seed in a.seeds:
        base = a.out / f"seed{seed}"
        base.mkdir(parents=True, exist_ok=True)
        sft_dir = base / "sft"
        arms = {"sft": ["sft", "--model", "smollm2", "--demos", "wordproblems-calculator", "demos_per_step=8",
                        f"max_steps={a.sft_steps}", "lr=5e-5", "eval_every=0", "eval_demos=16",
                        f"eval_size={a.eval_size}"],
                "sft+rl": ["train", "--model", str(sft_dir / "checkpoints" / f"step-{a.sft_steps}"), *rl],
                "rl": ["train", "--model", "smollm2", *rl]}
        for arm in a.arms:
            out = {"sft": sft_dir, "sft+rl": base / "sft_rl", "rl": base / "rl"}[arm]
            seconds = run([*arms[arm], *TOOLS, f"seed={seed}", "--out", str(out)], base / f"{arm.replace('+', '_')}.log")
            print(json.dumps({"seed": seed, "arm": arm, "wall_s": round(seconds, 1), **final(out)}), flush=True)


if __name__ == "__main__":
    main()
