"""Where the time of a grpoplus step goes on SmolLM2-135M (fp32, CPU), against the hardware's bounds.

    python benchmarks/profile_smollm2.py data --out /tmp/gsm_like.jsonl       # GSM8K-like problems
    python benchmarks/profile_smollm2.py parts [--threads 1,2] [--repeats 3]  # decode and learner alone
    python benchmarks/profile_smollm2.py step --data /tmp/gsm_like.jsonl [--steps 3] [--profile] [key=value ...]

Run with ``OMP_WAIT_POLICY=PASSIVE`` on a shared machine (see NOTES-perf.md: spinning
OpenMP threads slow everything several-fold when another process holds a core). The
model is ``smollm2`` (GGUF, ~40 s to load) unless ``GRPOPLUS_SMOLLM2`` names a local
Hugging Face dir saved from it (``model.save_pretrained(dir); tok.save_pretrained(dir)``,
~6 s to load).

``parts`` times (wall and CPU seconds) the decode of 4 prompts x 4 samples x 48 new tokens and one learner
forward + backward of those rollouts, and prints them against the bounds: the decode
against reading every weight once per step at 26 GB/s (and at the bandwidth this
process measures right now, since other processes share the memory bus), the learner
as MFU (6 x params x tokens / seconds against 145 GFLOP/s, and against the fp32 matmul
rate measured right now).

``step`` builds the trainer's components for ``grpoplus train --model smollm2 --data
FILE --prompt-field question --answer-field answer answer_format=gsm8k`` at 4 prompts x 4
samples x 48 tokens, runs the steps, and prints seconds per step split into rollout,
reward and learner; ``--profile`` records the last step with torch.profiler and splits
its CPU time by phase (rollout / logp_old-ref / learner forward / backward / optimizer)
and by kind of op (matmul / attention / softmax-logprob-sampling / elementwise).

Every line of output is JSON. Timings on a shared machine are noisy: run A/B comparisons
alternately and read ``uptime`` before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch

PEAK_GFLOPS = 145.0  # fp32 matmul, 2 cores, idle machine
PEAK_GBS = 26.0  # memory bandwidth, idle machine
MODEL = os.environ.get("GRPOPLUS_SMOLLM2", "smollm2")  # or a local HF dir saved from it (loads in seconds)

TEMPLATES = (
    ("{a} has {x} apples. {a} buys {y} more and gives away {z}. How many apples does {a} have now?",
     lambda x, y, z: (f"{x} + {y} - {z} = {x + y - z}", x + y - z)),
    ("A box holds {x} pens. {a} fills {y} boxes and then loses {z} pens. How many pens are left?",
     lambda x, y, z: (f"{x} * {y} - {z} = {x * y - z}", x * y - z)),
    ("{a} reads {x} pages a day for {y} days, then {z} pages more. How many pages did {a} read?",
     lambda x, y, z: (f"{x} * {y} + {z} = {x * y + z}", x * y + z)),
    ("A train carries {x} people. At a stop {z} get off and {y} get on. How many people are on the train?",
     lambda x, y, z: (f"{x} - {z} + {y} = {x - z + y}", x - z + y)),
)


def problems(n: int, seed: int) -> list[dict]:
    """``n`` GSM8K-like word problems: ``{"question", "answer": "<work>\\n#### <number>"}``."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        question, solve = rng.choice(TEMPLATES)
        x, y, z = rng.randint(12, 60), rng.randint(2, 9), rng.randint(1, 11)
        work, result = solve(x, y, z)
        name = rng.choice(["Tom", "Sara", "Ali", "Mei", "Ravi", "Lena"])
        rows.append({"question": question.format(a=name, x=x, y=y, z=z), "answer": f"{work}\n#### {result}"})
    return rows


def machine_now() -> dict:
    """What the hardware gives this process right now: memory GB/s (a 256 MB sum) and fp32 matmul GFLOP/s."""
    big, a, b = torch.randn(64 << 20), torch.randn(2048, 576), torch.randn(576, 1536)
    big.sum(), a @ b
    t = time.perf_counter()
    big.sum()
    gbs = big.numel() * 4 / (time.perf_counter() - t) / 1e9
    t = time.perf_counter()
    for _ in range(10):
        a @ b
    gflops = 10 * 2 * a.shape[0] * a.shape[1] * b.shape[1] / (time.perf_counter() - t) / 1e9
    return {"now_gb_s": round(gbs, 1), "now_matmul_gflop_s": round(gflops, 1)}


def threads_info() -> dict:
    return {"torch_threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "MKL_NUM_THREADS": os.environ.get("MKL_NUM_THREADS"), "load_avg_1min": os.getloadavg()[0]}


def parts_once(model, tok, prompts, generator) -> dict:
    """One decode of the prompts (4 samples x 48 tokens) and one learner forward + backward of its rollouts."""
    from grpoplus.learner.logprobs import response_logprobs_from_rollouts
    from grpoplus.rollout import HFEngine, SamplingParams

    now = machine_now()
    c0, t0 = time.process_time(), time.perf_counter()
    r = HFEngine(model, tok).generate(prompts, SamplingParams(n=4, max_new_tokens=48), generator=generator)
    c1, t1 = time.process_time(), time.perf_counter()
    model.train()
    logp, _ = response_logprobs_from_rollouts(model, r, with_entropy=True)
    t2 = time.perf_counter()
    (logp * r.response_mask).sum().backward()
    c3, t3 = time.process_time(), time.perf_counter()
    model.zero_grad(set_to_none=True)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    steps, generated = r.response_ids.shape[1], float(r.response_mask.sum())
    seen = float(r.prompt_mask.sum() + r.response_mask.sum())  # real tokens of the learner forward
    learner_s = t3 - t1
    return {
        **now, "decode_s": round(t1 - t0, 2), "decode_cpu_s": round(c1 - c0, 2), "learner_cpu_s": round(c3 - c1, 2),
        "decode_tok_s": round(generated / (t1 - t0), 1), "decode_steps": steps,
        # A decode step reads every weight once: the bandwidth floor; 2 flops per weight and row: the compute floor.
        "decode_bw_fraction": round(weight_bytes * steps / PEAK_GBS / 1e9 / (t1 - t0), 3),
        "decode_bw_fraction_now": round(weight_bytes * steps / now["now_gb_s"] / 1e9 / (t1 - t0), 3),
        "decode_compute_floor_s": round(2 * params * generated / PEAK_GFLOPS / 1e9, 2),
        "learner_fwd_s": round(t2 - t1, 2), "learner_bwd_s": round(t3 - t2, 2),
        "learner_tokens": int(seen), "response_tokens": int(generated),
        "learner_mfu": round(6 * params * seen / learner_s / PEAK_GFLOPS / 1e9, 3),
        "learner_mfu_now": round(6 * params * seen / learner_s / now["now_matmul_gflop_s"] / 1e9, 3),
        "learner_mfu_response_only": round(6 * params * generated / learner_s / PEAK_GFLOPS / 1e9, 3),
    }


def run_parts(repeats: int, thread_counts: list[int]) -> None:
    """``repeats`` rounds; each round runs every thread count in turn (A/B under the same load)."""
    from grpoplus.models.load import load_policy

    model, tok = load_policy(MODEL)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p["question"]}], tokenize=False,
                                       add_generation_prompt=True) for p in problems(4, seed=1)]
    print(json.dumps({"bench": "parts", **threads_info()}))
    parts_once(model, tok, prompts, torch.Generator().manual_seed(0))  # warm-up
    runs: dict[int, list[dict]] = {n: [] for n in thread_counts}
    for i in range(repeats):
        for n in thread_counts:
            torch.set_num_threads(n)
            runs[n].append(parts_once(model, tok, prompts, torch.Generator().manual_seed(i)))
            print(json.dumps({"repeat": i, **threads_info(), **runs[n][-1]}), flush=True)
    for n, rows in runs.items():
        print(json.dumps({"threads": n, "median": {k: statistics.median(r[k] for r in rows) for k in rows[0]}}))


PHASES = ("rollout", "logp_old_ref", "learner_forward", "optimizer")
KINDS = (("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::addmm_", "aten::baddbmm", "mkl::_mkl_linear")),
         ("attention", ("scaled_dot_product", "flash_attention")),
         ("softmax/logprob/sampling", ("softmax", "logsumexp", "cumsum", "searchsorted", "gather", "scatter",
                                      "exp", "multinomial", "exponential", "argmax", "sort")),
         ("optimizer", ("_foreach_",)))


def labelled(name: str, fn):
    def wrapper(*args, **kwargs):
        with torch.profiler.record_function(name):
            return fn(*args, **kwargs)
    return wrapper


def label_phases(c) -> None:
    """Name the trainer's phases for the profiler (backward is found from the autograd engine's events)."""
    import grpoplus.learner.prepare
    import grpoplus.learner.update

    c.engine.generate = labelled("rollout", c.engine.generate)
    grpoplus.learner.prepare.learner_logprobs = labelled("logp_old_ref", grpoplus.learner.prepare.learner_logprobs)
    grpoplus.learner.update.response_logprobs = labelled("learner_forward", grpoplus.learner.update.response_logprobs)
    label = torch.profiler.record_function("optimizer")  # hooks, as wrapping step() upsets the LR scheduler
    optimizer = c.learner.parts.optimizer
    optimizer.register_step_pre_hook(lambda *_: None if label.__enter__() else None)
    optimizer.register_step_post_hook(lambda *_: label.__exit__(None, None, None))


def split_profile(events) -> dict:
    """Self CPU seconds of every op by (phase, kind); phase from the enclosing label or the autograd engine."""
    table: dict[str, dict[str, float]] = {}
    for ev in events:
        phase, parent = "other", ev
        while parent is not None:
            if parent.name in PHASES:
                phase = parent.name
                break
            if parent.name.startswith("autograd::engine::evaluate_function"):
                phase = "learner_backward"
                break
            parent = parent.cpu_parent
        kind = next((k for k, keys in KINDS if any(key in ev.name for key in keys)), "elementwise/other")
        row = table.setdefault(phase, {})
        row[kind] = row.get(kind, 0.0) + ev.self_cpu_time_total / 1e6
    return {phase: {k: round(v, 2) for k, v in sorted(row.items())} | {"total": round(sum(row.values()), 2)}
            for phase, row in table.items()}


def run_step(data: str, steps: int, profile: bool, preset: str | None, overrides: list[str]) -> None:
    from grpoplus.assemble import assemble
    from grpoplus.config import build_config
    from grpoplus.loop.driver import train_step
    from grpoplus.plan import resolve

    cfg = build_config(preset, overrides=[
        f"model={MODEL}", f"data={data}", "prompt_field=question", "answer_field=answer", "answer_format=gsm8k",
        "prompts_per_step=4", "group_size=4", "max_new_tokens=48", f"max_steps={steps}", "eval_every=0",
        "eval_samples=0", "eval_size=4", "save_every=0", "out=/tmp/_grpoplus_bench_run", "progress=false",
        "loggers=[]", "doctor_every=0", *overrides])
    c = assemble(resolve(cfg))
    print(json.dumps({"bench": "step", "preset": cfg.run.preset, **threads_info(), **machine_now()}))
    label_phases(c)
    for step in range(1, steps + 1):
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) \
            if profile and step == steps else None
        c0, t0 = time.process_time(), time.perf_counter()
        if prof:
            with prof:
                metrics, scored = train_step(c, step)
        else:
            metrics, scored = train_step(c, step)
        record = {"step": step, "step_s": round(time.perf_counter() - t0, 2),
                  "cpu_s": round(time.process_time() - c0, 2), "load_avg_1min": os.getloadavg()[0]}
        record.update({k: round(metrics[k], 3) for k in ("time/rollout_s", "time/reward_s", "time/learner_s",
                                                          "sampling/rounds", "length/mean", "reward/mean")
                       if k in metrics})
        record["learner_tokens"] = int(scored.rollouts.prompt_mask.sum() + scored.rollouts.response_mask.sum())
        print(json.dumps(record), flush=True)
        if prof:
            print(json.dumps({"profile_step": step, "self_cpu_s": split_profile(prof.events())}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["data", "parts", "step"])
    parser.add_argument("--out", default="/tmp/gsm_like.jsonl", help="data: the JSONL to write")
    parser.add_argument("--rows", type=int, default=200, help="data: problems to write")
    parser.add_argument("--data", default="/tmp/gsm_like.jsonl", help="step: the JSONL to train on")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="0",
                        help="torch CPU threads (0: torch's default); parts: a comma list is run alternately")
    parser.add_argument("--profile", action="store_true", help="step: torch.profiler on the last step")
    parser.add_argument("--preset", default=None)
    parser.add_argument("overrides", nargs="*", help="step: extra key=value config overrides")
    args = parser.parse_args()
    thread_counts = [int(n) or torch.get_num_threads() for n in args.threads.split(",")]
    if args.which == "data":
        with open(args.out, "w") as handle:
            handle.writelines(json.dumps(row) + "\n" for row in problems(args.rows, seed=0))
        print(json.dumps({"wrote": args.out, "rows": args.rows}))
    elif args.which == "parts":
        run_parts(args.repeats, thread_counts)
    else:
        run_step(args.data, args.steps, args.profile, args.preset, args.overrides + [f"threads={thread_counts[0]}"])


if __name__ == "__main__":
    main()
