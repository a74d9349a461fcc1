"""Routing replay on the tiny MoE (ALGORITHMS.md section 8): does replaying the expert routing
change what token-level GRPO with several updates per batch does?

    python benchmarks/moe_replay.py [--steps 40] [--seeds 0 1] [--setting default|stress] [--out runs/moe_replay]
        [--record]

Four arms on ``--model tiny-moe`` (the warm start of seed 0 for every seed, so only the RL seed
varies), task arithmetic, 16 prompts x 8 responses per step, no KL:

- ``grpo_token``: preset grpo, token-mean aggregation, 4 mini-batch updates per rollout batch;
- ``gspo``: preset gspo (sequence-level ratio, 4 mini-batch updates);
- ``grpo_r2``: grpo_token + ``algo.routing_replay=r2``;
- ``grpo_r3``: grpo_token + ``algo.routing_replay=r3``.

Setting ``stress`` (``--setting stress``) raises the drift and opens a sampler/learner gap for
every arm: learning rate 1e-3, 8 mini-batch updates, sampler weights rounded to bf16.

Per run (means over the training steps): clip fraction (low + high), the token ratio's spread
(``loss/ratio_max``: its mean, standard deviation, peak and mean log over steps; ``|loss/ratio_mean - 1|``;
``loss/approx_kl``), ``moe/routing_mismatch`` (all updates) and ``moe/routing_mismatch_first``
(the first update of each batch), held-out accuracy (greedy and sampled, first and last
evaluation) and seconds per step. :data:`EXPERIMENT` is the same description as data
(configs, metric, rule) for a declarative experiment runner; :func:`verdict` is the rule.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

from records import add_record_argument, store

BASE = ["beta=0", "aggregation=token_mean", "num_minibatches=4"]
ARMS: dict[str, tuple[str, list[str]]] = {
    "grpo_token": ("grpo", BASE),
    "gspo": ("gspo", []),
    "grpo_r2": ("grpo", [*BASE, "routing_replay=r2"]),
    "grpo_r3": ("grpo", [*BASE, "routing_replay=r3"]),
}
COMMON = ["task=arithmetic", "prompts_per_step=16", "group_size=8", "eval_every=20", "eval_size=200",
          "eval_samples=4", "save_every=0", "keep_checkpoints=1", "log_samples=0", "doctor_every=0", "loggers=[]",
          "progress=false", "threads=1"]
SETTINGS: dict[str, list[str]] = {
    "default": [],
    # More drift per batch (8 updates at 5x the learning rate) and a sampler/learner precision gap
    # (the sampler's weights rounded to bf16), so the sampler's routing differs from the learner's.
    "stress": ["lr=1e-3", "num_minibatches=8", "quantization=bf16_rounded"],
}
BASELINE = "grpo_token"
SAMPLED_EVALS = 200 * 4  # held-out prompts x samples: the binomial count behind eval/accuracy_sampled

EXPERIMENT = {
    "name": "moe_routing_replay",
    "model": "tiny-moe (warm start of seed 0 for every seed)",
    "arms": {name: {"preset": preset, "overrides": [*overrides, *COMMON]}
             for name, (preset, overrides) in ARMS.items()},
    "settings": SETTINGS,
    "seeds": [0, 1],
    "steps": 40,
    "metrics": ["loss/clip_frac_low + loss/clip_frac_high", "loss/ratio_max", "loss/ratio_mean", "loss/approx_kl",
                "moe/routing_mismatch", "moe/routing_mismatch_first", "eval/accuracy", "eval/accuracy_sampled"],
    "rule": ("per arm vs grpo_token, paired by seed: 'ratio tamed' ('ratio wilder') when ratio_max (mean over "
             "steps) is lower (higher) in every seed and the seed-mean difference exceeds 2 standard errors of a "
             "difference of two step means (from the baseline's step-to-step std of ratio_max); 'accuracy "
             "differs' when the seed-mean difference of the last eval/accuracy_sampled exceeds 2 standard errors "
             "of a difference of two proportions over 800 samples per seed; otherwise no resolvable difference"),
}


def summarise(records: list[dict]) -> dict[str, float]:
    """One run's metrics.jsonl records -> the experiment's numbers."""
    steps = [r for r in records if "loss/ratio_max" in r]
    evals = [r for r in records if "eval/accuracy" in r]

    def series(fn) -> list[float]:
        return [fn(r) for r in steps]

    ratio_max = series(lambda r: r["loss/ratio_max"])
    out = {
        "clip_frac": statistics.fmean(series(lambda r: r["loss/clip_frac_low"] + r["loss/clip_frac_high"])),
        "ratio_max": statistics.fmean(ratio_max), "ratio_max_std": statistics.pstdev(ratio_max),
        "ratio_max_peak": max(ratio_max), "log_ratio_max": statistics.fmean(math.log(v) for v in ratio_max),
        "ratio_mean_dev": statistics.fmean(series(lambda r: abs(r["loss/ratio_mean"] - 1.0))),
        "approx_kl": statistics.fmean(series(lambda r: r["loss/approx_kl"])),
        "routing_mismatch": statistics.fmean(series(lambda r: r["moe/routing_mismatch"])),
        "routing_mismatch_first": statistics.fmean(series(lambda r: r["moe/routing_mismatch_first"])),
        "load_max_frac": statistics.fmean(series(lambda r: r["moe/load_max_frac"])),
        "acc_start": evals[0]["eval/accuracy"], "acc_end": evals[-1]["eval/accuracy"],
        "acc_sampled_start": evals[0]["eval/accuracy_sampled"], "acc_sampled_end": evals[-1]["eval/accuracy_sampled"],
        "reward_last10": statistics.fmean(r["reward/mean"] for r in steps[-10:]),
        "step_s": statistics.fmean(series(lambda r: r["time/step_s"] - r.get("time/eval_s", 0.0))),
        "steps": len(steps),
    }
    return {k: round(v, 5) for k, v in out.items()}


def run_arm(name: str, seed: int, steps: int, model: str, out: Path, setting: list[str]) -> dict[str, float]:
    from grpoplus.config import build_config
    from grpoplus.loop.driver import train

    preset, overrides = ARMS[name]
    cfg = build_config(preset, overrides=[*overrides, *COMMON, *setting, f"max_steps={steps}", f"seed={seed}",
                                          f"learner.model={model}", f"out={out / f'{name}-s{seed}'}", "overwrite=true"])
    return summarise(train(cfg))


def verdict(results: dict[str, dict[int, dict[str, float]]]) -> list[str]:
    """The rule of :data:`EXPERIMENT` applied to ``results[arm][seed]`` (summaries); one line per arm."""
    base = results[BASELINE]
    lines = []
    for arm, runs in results.items():
        if arm == BASELINE:
            continue
        seeds = sorted(set(runs) & set(base))
        d_ratio = [runs[s]["ratio_max"] - base[s]["ratio_max"] for s in seeds]
        # Standard error of a difference of two means over the steps, from the baseline's step-to-step spread.
        se_ratio = statistics.fmean(base[s]["ratio_max_std"] * math.sqrt(2 / base[s]["steps"]) for s in seeds)
        se_ratio /= math.sqrt(len(seeds))
        d_acc = statistics.fmean(runs[s]["acc_sampled_end"] - base[s]["acc_sampled_end"] for s in seeds)
        p = statistics.fmean(base[s]["acc_sampled_end"] for s in seeds)
        # Standard error of a difference of two proportions, each over SAMPLED_EVALS samples per seed.
        se = math.sqrt(2 * p * (1 - p) / (SAMPLED_EVALS * len(seeds)))
        shift = statistics.fmean(d_ratio)
        ratio = ("ratio tamed" if all(d < 0 for d in d_ratio) and shift < -2 * se_ratio else
                 "ratio wilder" if all(d > 0 for d in d_ratio) and shift > 2 * se_ratio else
                 "no resolvable ratio change")
        acc = "accuracy differs" if abs(d_acc) > 2 * se else "no resolvable accuracy difference"
        lines.append(f"{arm} vs {BASELINE}: {ratio} (d ratio_max per seed {[round(d, 3) for d in d_ratio]}, "
                     f"2 SE {2 * se_ratio:.3f}); "
                     f"{acc} (d acc_sampled {d_acc:+.3f}, 2 SE {2 * se:.3f})")
    return lines


def table(results: dict[str, dict[int, dict[str, float]]]) -> str:
    """Markdown: one row per arm, seed means with the per-seed values in brackets."""
    keys = ["clip_frac", "ratio_max", "ratio_max_std", "ratio_max_peak", "log_ratio_max", "ratio_mean_dev", "approx_kl",
            "routing_mismatch", "routing_mismatch_first", "acc_start", "acc_end", "acc_sampled_end", "step_s"]
    rows = ["| arm | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for arm, runs in results.items():
        cells = []
        for key in keys:
            values = [runs[s][key] for s in sorted(runs)]
            cells.append(f"{statistics.fmean(values):.4g} [{', '.join(f'{v:.3g}' for v in values)}]")
        rows.append(f"| {arm} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=EXPERIMENT["steps"])
    parser.add_argument("--seeds", type=int, nargs="+", default=EXPERIMENT["seeds"])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--setting", default="default", choices=list(SETTINGS))
    parser.add_argument("--out", default="runs/moe_replay")
    add_record_argument(parser)
    args = parser.parse_args()
    from grpoplus.sft.warmstart import build_warmstart

    model = str(build_warmstart("arithmetic", None, size="moe", seed=0))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[int, dict[str, float]]] = {arm: {} for arm in args.arms}
    for seed in args.seeds:  # seeds outermost: a cut-short run still has every arm of the first seed
        for arm in args.arms:
            t0 = time.perf_counter()
            results[arm][seed] = run_arm(arm, seed, args.steps, model, out, SETTINGS[args.setting])
            print(f"{arm} seed {seed}: {time.perf_counter() - t0:.0f} s {json.dumps(results[arm][seed])}", flush=True)
            (out / "summary.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    if BASELINE in results:
        print("\n".join(verdict(results)))
    store(f"moe_replay_{args.setting}", {"setting": args.setting, "steps": args.steps, "results": results,
                                        "verdicts": verdict(results) if BASELINE in results else []}, args.record)


def _results(figures: dict) -> dict[str, dict[int, dict[str, float]]]:
    return {arm: {int(s): v for s, v in runs.items()} for arm, runs in figures["results"].items()}


VIEWS = {"table": lambda figures: table(_results(figures)),
         "verdicts": lambda figures: "\n".join(f"- {line}" for line in figures["verdicts"]) + "\n"}
"""What a page renders from a record (``benchmarks/render.py``)."""


if __name__ == "__main__":
    main()
