"""SmolLM2-135M side by side: grpoplus vs TRL's GRPOTrainer, and LoRA vs full fine-tuning.

Same model (fp32), same chat prompts (the ``wordproblems`` task through the model's chat
template), same reward (its verifier), 4 prompts x 4 samples = 16 completions of <= 48 new
tokens, temperature 1, one update per batch, no KL, clip 0.2, token-mean loss (TRL's
default ``loss_type="dapo"``; grpoplus: the dapo preset without dynamic sampling or
overlong shaping), AdamW at lr 1e-6. Each side runs in its own process, one process per call,
so peak resident memory (``ru_maxrss``) is the side's own::

    M=/tmp/smollm2-hf   # a Hugging Face dir of SmolLM2-135M-Instruct (made once by `save`)
    python benchmarks/smollm2_vs_trl.py save --model $M
    python benchmarks/smollm2_vs_trl.py trl --model $M --steps 4 >> runs.jsonl
    python benchmarks/smollm2_vs_trl.py grpoplus --model $M --steps 4 >> runs.jsonl
    python benchmarks/smollm2_vs_trl.py grpoplus --model $M --steps 4 gradient_checkpointing=true \
        release_memory=eager >> runs.jsonl   # like TRL's default: activation checkpointing on
    python benchmarks/smollm2_vs_trl.py grpoplus --model $M --steps 4 lora_rank=16 >> runs.jsonl
    python benchmarks/smollm2_vs_trl.py summary runs.jsonl   # calls grouped by side and overrides
    python benchmarks/smollm2_vs_trl.py compare --model $M --rounds 2 --record   # all of it, alternated, as a record

Alternate the calls (trl, grpoplus, grpoplus lora, trl, ...) so that both sides see the same
machine. Each call prints one JSON line: the median seconds per step after ``--warmup``
steps (range too), the peak RSS, and for grpoplus the rollout / learner split, the learner's
MFU (6 x params x learner tokens / learner seconds, against the measured 145 GFLOP/s fp32
matmul peak of this project's first 2-core machine; ``learner_mfu_now`` against the rate a 2048 x 2048
matmul gets in the same process just before the run) and the decode's fraction of the weight-bandwidth
bound (every weight read once per decode step at 26 GB/s): ``decode_bw_fraction`` for the decode
steps (the rollout less the prompts' prefill, which ``prefill_s_median`` reports), ``rollout_bw_fraction``
for the whole rollout. ``summary`` prints the medians of the calls and the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402
from records import add_record_argument, package_version, store  # noqa: E402

from grpoplus.models import cpu_matmul  # noqa: E402

PEAK_GFLOPS = 145.0  # fp32 matmul, 2 cores, idle machine (benchmarks/profile_smollm2.py)
PEAK_GBS = 26.0  # memory bandwidth, idle machine
PROMPTS, GROUP, NEW_TOKENS, LR = 4, 4, 48, 1e-6


def matmul_gflops_now(size: int = 2048, repeats: int = 10, device: str = "cpu", dtype: torch.dtype = torch.float32,
                      warmup: int = 1, onednn: bool = False) -> float:
    """The matmul rate (GFLOP/s) this process gets right now on ``device`` in ``dtype`` (a machine's peak drifts, and
    a CPU is shared), ``size`` x ``size`` matrices timed over ``repeats`` products after ``warmup`` ones; torch's
    product, or ``onednn``: the one grpoplus's learner.cpu_matmul=onednn makes (a float32 CPU product; 0.0 where this
    torch lacks it)."""
    if onednn and not cpu_matmul.onednn_available():
        return 0.0  # this torch has no oneDNN linear op
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    product = (lambda: cpu_matmul.onednn_linear(a, b.T)) if onednn else (lambda: a @ b)
    for _ in range(warmup):
        product()
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        product()
    sync()
    return 2 * size ** 3 * repeats / (time.perf_counter() - t0) / 1e9


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: kB


def chat_problems(n: int) -> list:
    """``n`` training problems of the wordproblems task (raw questions; each side applies the template)."""
    from grpoplus.tasks import get_task

    return list(get_task("wordproblems", seed=0).split("train"))[:n]


def spread(times: list[float], warmup: int) -> dict:
    kept = times[warmup:] or times
    return {"median_s_per_step": round(statistics.median(kept), 2), "min_s": round(min(kept), 2),
            "max_s": round(max(kept), 2), "steps_measured": len(kept)}


def timed(fn, spent: list[float]):
    """``fn``, appending the seconds of each call to ``spent``."""
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        spent.append(time.perf_counter() - t0)
        return out

    return call


def run_trl(model_dir: str, steps: int, warmup: int) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpoplus.tasks.wordproblems import wordproblem_reward

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.start = [], 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            self.start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.start)

    def reward(prompts, completions, answer, **_):  # conversational completions: [{"role", "content"}]
        return wordproblem_reward(prompts, [c[-1]["content"] for c in completions], answer)

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    decode_s: list[float] = []
    model.generate = timed(model.generate, decode_s)  # TRL samples through model.generate on CPU
    rows = chat_problems(steps * PROMPTS)
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": e.prompt}] for e in rows],
                              "answer": [e.answer for e in rows]})
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out_dir:
        config = GRPOConfig(output_dir=out_dir, use_cpu=True, max_steps=steps, per_device_train_batch_size=PROMPTS * GROUP,
                            num_generations=GROUP, max_completion_length=NEW_TOKENS, temperature=1.0,
                            learning_rate=LR, beta=0.0, logging_steps=10**6, save_strategy="no", report_to="none",
                            dataloader_num_workers=0, seed=0, bf16=False, fp16=False, disable_tqdm=True)
        GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data, processing_class=tok,
                    callbacks=[timer]).train()
    return {"side": "trl", "trl_version": __import__("trl").__version__,
            "gradient_checkpointing": config.gradient_checkpointing,  # TRL's GRPOConfig default: on
            **spread(timer.times, warmup),
            "rollout_s_median": round(statistics.median(decode_s[warmup:] or decode_s), 2)}


def run_grpoplus(model_dir: str, steps: int, warmup: int, overrides: list[str]) -> dict:
    from grpoplus.assemble import assemble
    from grpoplus.config import build_config
    from grpoplus.loop.driver import train_step
    from grpoplus.plan import resolve

    cfg = build_config("dapo", overrides=[
        f"model={model_dir}", "task=wordproblems", f"prompts_per_step={PROMPTS}", f"group_size={GROUP}",
        f"max_new_tokens={NEW_TOKENS}", "dynamic_sampling=false", "overlong_shaping=false", "eps_high=0.2",
        "num_minibatches=1", "num_iterations=1",  # one update per batch (the dapo preset takes 4)
        f"lr={LR}", "warmup_steps=0", "lr_schedule=constant", f"max_steps={steps}", "eval_every=0",
        "save_every=0", f"out={tempfile.mkdtemp(prefix='grpoplus-bench-')}", "progress=false", *overrides])
    c = assemble(resolve(cfg))
    import grpoplus.rollout.hf as hf

    prefill_s: list[float] = []
    hf.prefill = timed(hf.prefill, prefill_s)  # the hf engine's prompt prefill, from now on
    full = [p for p in c.learner.parts.model.parameters()]
    params = sum(p.numel() for p in full)
    weight_bytes = sum(p.numel() * p.element_size() for p in full)
    trainable = sum(p.numel() for p in full if p.requires_grad)
    times, rows = [], []
    for step in range(1, steps + 1):
        t0, prefilled = time.perf_counter(), sum(prefill_s)
        metrics, scored = train_step(c, step)
        times.append(time.perf_counter() - t0)
        r = scored.rollouts
        rows.append({"rollout_s": metrics["time/rollout_s"], "prefill_s": sum(prefill_s) - prefilled,
                     "learner_s": metrics["time/learner_s"],
                     "learner_tokens": float(computed_tokens(r, cfg.learner.share_prompts)),
                     "decode_steps": r.response_ids.shape[1], "reward": metrics.get("reward/mean", float("nan"))})
    c.close()
    kept = rows[warmup:] or rows
    med = {k: statistics.median(row[k] for row in kept) for k in kept[0]}
    # 6 flops per parameter and token (forward 2, backward 4) for full fine-tuning; with LoRA the frozen
    # weights get no weight gradient (forward 2 + input-gradient 2 = 4).
    flops_per = 6 if trainable == params else 4
    bound_s = weight_bytes * med["decode_steps"] / PEAK_GBS / 1e9  # every weight read once per decode step
    return {"side": "grpoplus", "overrides": " ".join(overrides), "params": params, "trainable": trainable,
            **spread(times, warmup), "rollout_s_median": round(med["rollout_s"], 2),
            "prefill_s_median": round(med["prefill_s"], 2),
            "learner_s_median": round(med["learner_s"], 2), "learner_tokens": int(med["learner_tokens"]),
            "learner_mfu": round(flops_per * params * med["learner_tokens"] / med["learner_s"] / PEAK_GFLOPS / 1e9, 3),
            # the decode steps alone (the rollout less the prompts' prefill), and the whole rollout
            "decode_bw_fraction": round(bound_s / (med["rollout_s"] - med["prefill_s"]), 3),
            "rollout_bw_fraction": round(bound_s / med["rollout_s"], 3),
            "reward_mean": round(med["reward"], 3)}


def computed_tokens(r, share_prompts: bool) -> int:
    """Real tokens the learner forwards: every row's prompt and response, or with ``learner.share_prompts`` each
    distinct prompt once (the micro-batch of 16 rows holds whole groups) and every response."""
    rows = torch.cat([r.prompt_ids * r.prompt_mask, r.prompt_mask], 1)
    prompts = torch.unique(rows, dim=0) if share_prompts else rows
    return int(prompts[:, r.prompt_ids.shape[1]:].sum()) + int(r.response_mask.sum())


def summary(path: str) -> None:
    """Medians over the calls of each side, and grpoplus's ratios against TRL."""
    sides: dict[str, list[dict]] = {}
    with open(path) as handle:
        for line in handle:
            if line.startswith('{"'):  # the JSON records (TRL prints its own dict too)
                rec = json.loads(line)
                key = " ".join(filter(None, (rec["side"], rec.get("overrides"))))
                sides.setdefault(key, []).append(rec)
    table = {key: {k: statistics.median(r[k] for r in recs) for k in recs[0] if isinstance(recs[0][k], (int, float))}
             | {"calls": len(recs)} for key, recs in sides.items()}
    for key, row in table.items():
        print(json.dumps({key: row}))
    if "trl" in table and "grpoplus" in table:
        trl, ours = table["trl"], table["grpoplus"]
        print(json.dumps({"steps_per_s_ratio": round(trl["median_s_per_step"] / ours["median_s_per_step"], 2),
                          "peak_rss_ratio": round(ours["peak_rss_mb"] / trl["peak_rss_mb"], 2)}))
    for key in [k for k in table if k.startswith("grpoplus ") and "grpoplus" in table]:
        base, other = table["grpoplus"], table[key]
        print(json.dumps({f"{key} / grpoplus": {
            "step_time_ratio": round(other["median_s_per_step"] / base["median_s_per_step"], 2),
            "peak_rss_ratio": round(other["peak_rss_mb"] / base["peak_rss_mb"], 2)}}))


COMPARED = (("trl", []), ("grpoplus", []), ("grpoplus", ["gradient_checkpointing=true", "release_memory=eager"]),
            ("grpoplus", ["lora_rank=16"]))
"""What ``compare`` alternates: TRL at its defaults, grpoplus at its defaults, with checkpointing like TRL's, and
with LoRA."""


def compare(model: str, steps: int, warmup: int, rounds: int, record: str | None) -> None:
    """Every side of :data:`COMPARED` in its own process, alternated ``rounds`` times; each call's line, then per
    side the calls' medians and the steps/s and peak-memory ratios against the TRL call of the same round."""
    import subprocess

    calls = []
    for round_ in range(rounds):
        for side, overrides in COMPARED:
            done = subprocess.run([sys.executable, __file__, side, "--model", model, "--steps", str(steps),
                                   "--warmup", str(warmup), *overrides], capture_output=True, text=True)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith('{"')]
            if done.returncode or not lines:
                raise SystemExit(f"{side} {' '.join(overrides)} failed:\n{done.stdout[-1500:]}{done.stderr[-1500:]}")
            calls.append({**json.loads(lines[-1]), "round": round_, "overrides": " ".join(overrides)})
            print(json.dumps(calls[-1]), flush=True)
    sides = []
    for side, overrides in COMPARED:
        mine = [c for c in calls if c["side"] == side and c["overrides"] == " ".join(overrides)]
        trl = {c["round"]: c for c in calls if c["side"] == "trl"}
        sides.append({"side": " ".join([side, *overrides]), "s_per_step": [c["median_s_per_step"] for c in mine],
                      "peak_gb": [round(c["peak_rss_mb"] / 1000, 2) for c in mine],
                      "steps_per_s_vs_trl": [round(trl[c["round"]]["median_s_per_step"] / c["median_s_per_step"], 2)
                                             for c in mine],
                      "peak_vs_trl": [round(c["peak_rss_mb"] / trl[c["round"]]["peak_rss_mb"], 2) for c in mine]})
    figures = {"steps": steps, "warmup": warmup, "rounds": rounds, "trl": package_version("trl"),
               "cpu_matmul": sorted({str(c.get("cpu_matmul_onednn")) for c in calls if c["side"] == "grpoplus"}),
               "sides": sides, "calls": calls}
    print(json.dumps({"sides": sides}))
    store("smollm2_vs_trl", figures, record)


def vs_trl_table(figures: dict) -> str:
    """The results page's table from a ``compare`` record: per side, each round's figures."""
    def each(values, fmt: str, unit: str = "") -> str:
        return ", ".join(format(v, fmt) + unit for v in values)

    lines = ["| side | s/step per call | steps/s vs TRL (per round) | peak RSS (GB) | vs TRL (per round) |",
             "|---|---|---|---|---|"]
    for row in figures["sides"]:
        lines.append(f"| {row['side']} | {each(row['s_per_step'], '.2f')} | {each(row['steps_per_s_vs_trl'], '.2f', 'x')} | "
                     f"{each(row['peak_gb'], '.2f')} | {each(row['peak_vs_trl'], '.2f', 'x')} |")
    return "\n".join(lines)


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 2)


def speed_plot(figures: dict) -> dict:
    """Steps/s of each side against TRL's in the same round, the median over the rounds (:mod:`plots`)."""
    return {"kind": "bars", "title": "SmolLM2-135M GRPO step on a CPU: steps/s against TRL's", "unit": "x TRL",
            "labels": [row["side"] for row in figures["sides"]], "line": 1.0,
            "series": {"steps/s vs TRL": [_median(row["steps_per_s_vs_trl"]) for row in figures["sides"]],
                       "peak memory vs TRL": [_median(row["peak_vs_trl"]) for row in figures["sides"]]}}


def step_plot(figures: dict) -> dict:
    """Each side's median step split into rollout, learner and the rest (TRL's learner is not timed apart from the
    rest of its step)."""
    parts = {"rollout": [], "learner": [], "other": []}
    labels = []
    for row in figures["sides"]:
        calls = [c for c in figures["calls"] if " ".join(filter(None, (c["side"], c["overrides"]))) == row["side"]]
        step, rollout = _median([c["median_s_per_step"] for c in calls]), _median([c["rollout_s_median"] for c in calls])
        learner = _median([c["learner_s_median"] for c in calls]) if "learner_s_median" in calls[0] else 0.0
        labels.append(row["side"] if learner else f"{row['side']} (learner and other together)")
        parts["rollout"].append(rollout)
        parts["learner"].append(learner)
        parts["other"].append(round(max(0.0, step - rollout - learner), 2))
    return {"kind": "stacked", "title": "SmolLM2-135M GRPO step on a CPU: where the time goes", "labels": labels,
            "unit": "seconds per step (median)", "series": parts}


def parts_table(figures: dict) -> str:
    """Each grpoplus call's step against the hardware's bounds: the rollout (its prefill apart) and the decode's
    fraction of the weight-bandwidth floor, the learner's seconds, tokens and MFU (against the nominal 145 GFLOP/s and
    against the matmul rate measured in the same process)."""
    lines = ["| side | round | s/step | rollout s (prefill) | decode / bandwidth floor | learner s | learner tokens | "
             "learner MFU (145 / now) | matmul GFLOP/s now (oneDNN) |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in (c for c in figures["calls"] if c["side"] == "grpoplus"):
        side = " ".join(filter(None, ("grpoplus", c["overrides"])))
        lines.append(f"| {side} | {c['round'] + 1} | {c['median_s_per_step']:.2f} | {c['rollout_s_median']:.2f} "
                     f"({c['prefill_s_median']:.2f}) | {c['decode_bw_fraction']:.2f} | {c['learner_s_median']:.2f} | "
                     f"{c['learner_tokens']:,} | {c['learner_mfu']:.2f} / {c['learner_mfu_now']:.2f} | "
                     f"{c['matmul_gflops_now']:.0f} ({c['onednn_matmul_gflops_now']:.0f}) |")
    return "\n".join(lines)


VIEWS = {"table": vs_trl_table, "parts": parts_table}
"""What a page renders from a record (``benchmarks/render.py``)."""
PLOTS = {"speed": speed_plot, "step": step_plot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["save", "trl", "grpoplus", "summary", "compare"])
    parser.add_argument("--rounds", type=int, default=2, help="compare: alternations of every side")
    add_record_argument(parser, "compare")
    parser.add_argument("path", nargs="?", help="summary: the JSONL of the calls")
    parser.add_argument("--model", default="/tmp/smollm2-hf", help="a Hugging Face dir of SmolLM2-135M-Instruct")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the median")
    args, overrides = parser.parse_known_args()
    if args.which == "summary":
        return summary(args.path)
    if args.which == "compare":
        return compare(args.model, args.steps, args.warmup, args.rounds, args.record)
    if args.which == "save":
        from grpoplus.models.load import load_policy

        model, tok = load_policy("smollm2")
        model.save_pretrained(args.model)
        tok.save_pretrained(args.model)
        return print(json.dumps({"saved": args.model}))
    gflops = matmul_gflops_now()  # before the run, so that its memory is not in the side's peak
    onednn_gflops = matmul_gflops_now(onednn=True)
    started = time.perf_counter()
    record = run_trl(args.model, args.steps, args.warmup) if args.which == "trl" else \
        run_grpoplus(args.model, args.steps, args.warmup, overrides)
    if "learner_mfu" in record:  # against the faster library's matmul rate measured in this process before the run
        record["learner_mfu_now"] = round(record["learner_mfu"] * PEAK_GFLOPS / max(gflops, onednn_gflops), 3)
    print(json.dumps({**record, "matmul_gflops_now": round(gflops, 1),
                      "onednn_matmul_gflops_now": round(onednn_gflops, 1), "peak_rss_mb": round(peak_rss_mb(), 0),
                      "cpu_matmul_onednn": cpu_matmul.in_use(),
                      "torch_threads": torch.get_num_threads(), "load_avg_1min": os.getloadavg()[0],
                      "wall_s": round(time.perf_counter() - started, 1)}),
          flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
