"""The hf engine's rollout on SmolLM2-135M against its floors, eager and compiled (rollout.compile) side by side.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/decode_floor.py [--repeats 3] [--profile] [--no-compile]

The workload of benchmarks/smollm2_vs_trl.py: 4 wordproblems chat prompts (~80 tokens) x 4 samples x 48 new tokens,
fp32, CPU. ``GRPOPLUS_SMOLLM2`` names a local Hugging Face dir saved from ``smollm2`` (default /tmp/smollm2-hf,
``python benchmarks/smollm2_vs_trl.py save``); else the GGUF loads (~40 s).

Floors, from rates measured in this process just before the runs: the decode reads every weight once per step
(``bw_floor_s`` = weight bytes x steps / memory GB/s) and multiplies every weight by each live row
(``compute_floor_s`` = 2 x params x generated tokens / fp32 matmul GFLOP/s, the faster of torch's product and
oneDNN's, which the engine's packed weights use); the prompts' prefill does
2 x params x prompt tokens at the matmul rate (``prefill_floor_s``). ``decode_bw_fraction`` is the issue's measure
(bandwidth floor / decode seconds); with 16 rows a step does 8 flops per weight byte, above a 2-core CPU's
balance, so the compute floor is the higher one there (``decode_floor_fraction``: the higher floor / decode s).
The variants run alternately (load from other processes falls on both alike); the compiled one's first call,
which compiles, is reported apart. ``--profile`` splits one eager rollout's CPU time by kind of op.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from smollm2_vs_trl import matmul_gflops_now  # noqa: E402

KINDS = {"reorder_weights": ("reorder",), "linear": ("linear", "addmm", "mm"), "attention": ("attention",),
         "sampling": ("softmax", "cumsum", "exp", "searchsorted", "rand", "gather", "div", "double", "isin"),
         "cache_copy": ("index", "copy_")}


def memory_gbs_now() -> float:
    """Memory bandwidth this process gets right now (the best of three sums of 256 MB)."""
    big = torch.randn(64 << 20)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        big.sum()
        best = min(best, time.perf_counter() - t)
    return big.numel() * 4 / best / 1e9


def cpu_flags() -> str:
    from grpoplus.models.device import cpuinfo

    return " ".join(sorted(f for f in cpuinfo("flags").split() if f.startswith(("avx", "amx", "fma", "f16c"))))


def load():
    from grpoplus.models.load import load_policy
    from grpoplus.tasks import get_task
    from grpoplus.tasks.synthetic import with_chat_template

    model, tok = load_policy(os.environ.get("GRPOPLUS_SMOLLM2", "/tmp/smollm2-hf"))
    task = with_chat_template(get_task("wordproblems", seed=0), tok, "smollm2")
    return model.eval(), tok, [e.prompt for e in list(task.split("train"))[:4]]


def timed_rollout(engine, prompts, params, prefill_s: list[float]) -> dict:
    before = len(prefill_s)
    t = time.perf_counter()
    r = engine.generate(prompts, params, generator=torch.Generator().manual_seed(0))
    total = time.perf_counter() - t
    prefill = sum(prefill_s[before:])
    return {"rollout_s": total, "prefill_s": prefill, "decode_s": total - prefill, "rollouts": r}


def profile_kinds(engine, prompts, params) -> dict:
    """CPU seconds of one rollout by kind of op (self time of the top-level ops)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.generate(prompts, params, generator=torch.Generator().manual_seed(0))
    split = dict.fromkeys([*KINDS, "other"], 0.0)
    for event in prof.key_averages():
        kind = next((k for k, words in KINDS.items() if any(w in event.key for w in words)), "other")
        split[kind] += event.self_cpu_time_total / 1e6
    return {k: round(v, 3) for k, v in split.items()}


def floors_table(figures: dict) -> str:
    """Per variant: the rollout split into prefill and decode, against the floors measured in the same process."""
    printed = [v for call in figures["calls"] for v in call["printed"]]
    rates = next(v for v in printed if "matmul_gflops_now" in v)
    lines = ["| variant | first rollout s | rollout s | prefill s | decode s | bandwidth floor s | compute floor s | "
             "higher floor / decode | same tokens as eager | log-prob difference |", "|---|---:|---:|---:|---:|---:|"
             "---:|---:|---|---:|"]
    lines += [f"| {v['variant']} | {v['first_rollout_s']:.2f} | {v['rollout_s']:.2f} | {v['prefill_s']:.2f} | "
              f"{v['decode_s']:.2f} | {v['bw_floor_s']:.2f} | {v['compute_floor_s']:.2f} | "
              f"{v['decode_floor_fraction']:.2f} | {'yes' if v['same_tokens_as_eager'] else 'no'} | "
              f"{v['logp_max_diff_vs_eager']:.1e} |" for v in printed if "variant" in v]
    lines += ["", f"Rates measured in the process just before: memory {rates['memory_gb_s_now']} GB/s, fp32 matmul "
                  f"{rates['matmul_gflops_now']} GFLOP/s (torch's {rates['torch_matmul_gflops_now']}), "
                  f"{rates['torch_threads']} torch threads, load average {rates['load_avg_1min']:.1f}."]
    kinds = next((v["eager_cpu_s_by_kind"] for v in printed if "eager_cpu_s_by_kind" in v), None)
    if kinds:
        lines.append("One eager rollout's CPU seconds by kind of op: "
                     + ", ".join(f"{k} {s:.2f}" for k, s in sorted(kinds.items(), key=lambda kv: -kv[1])) + ".")
    return "\n".join(lines) + "\n"


VIEWS = {"table": floors_table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="split one eager rollout by kind of op")
    parser.add_argument("--no-compile", action="store_true", help="the eager engine alone")
    args = parser.parse_args()
    import grpoplus.rollout.hf as hf
    from grpoplus.rollout import EngineOptions, HFEngine, SamplingParams

    model, tok, prompts = load()
    params = SamplingParams(n=4, max_new_tokens=48)
    prefill_s: list[float] = []
    real_prefill = hf.prefill

    def prefill(*a, **kw):
        t = time.perf_counter()
        out = real_prefill(*a, **kw)
        prefill_s.append(time.perf_counter() - t)
        return out

    hf.prefill = prefill
    engines = {"eager": HFEngine(model, tok)}
    if not args.no_compile:
        engines["compiled"] = HFEngine(model, tok, EngineOptions(compile=True))
    first = {name: timed_rollout(e, prompts, params, prefill_s)["rollout_s"] for name, e in engines.items()}
    torch_gflops = matmul_gflops_now(size=1024)
    gflops = max(torch_gflops, matmul_gflops_now(size=1024, onednn=True))
    gbs = memory_gbs_now()
    runs: dict[str, list[dict]] = {name: [] for name in engines}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            runs[name].append(timed_rollout(engine, prompts, params, prefill_s))
    params_n = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    base = runs["eager"][0]["rollouts"]
    for name, rows in runs.items():
        r = rows[0]["rollouts"]
        steps, generated = r.response_ids.shape[1] - 1, float(r.response_mask.sum())  # the first token needs no step
        prompt_tokens = float(r.prompt_mask[:: params.n].sum())
        med = {k: statistics.median(row[k] for row in rows) for k in ("rollout_s", "prefill_s", "decode_s")}
        bw_floor, compute_floor = weight_bytes * steps / gbs / 1e9, 2 * params_n * generated / gflops / 1e9
        print(json.dumps({
            "variant": name, "first_rollout_s": round(first[name], 2), **{k: round(v, 3) for k, v in med.items()},
            "decode_steps": steps, "bw_floor_s": round(bw_floor, 3), "compute_floor_s": round(compute_floor, 3),
            "prefill_floor_s": round(2 * params_n * prompt_tokens / gflops / 1e9, 3),
            "decode_bw_fraction": round(bw_floor / med["decode_s"], 3),
            "decode_floor_fraction": round(max(bw_floor, compute_floor) / med["decode_s"], 3),
            "same_tokens_as_eager": bool(torch.equal(r.response_ids, base.response_ids)),
            "logp_max_diff_vs_eager": float((r.logp_roll - base.logp_roll).abs().max()),
        }))
    print(json.dumps({"memory_gb_s_now": round(gbs, 1), "matmul_gflops_now": round(gflops, 1),
                      "torch_matmul_gflops_now": round(torch_gflops, 1),
                      "torch_threads": torch.get_num_threads(), "load_avg_1min": os.getloadavg()[0],
                      "cpu_flags": cpu_flags()}))
    if args.profile:
        print(json.dumps({"eager_cpu_s_by_kind": profile_kinds(engines["eager"], prompts, params)}))


if __name__ == "__main__":
    main()
