"""Compiled learner layers (learner.compile) against eager ones: one learner step side by side, in one process.

    python benchmarks/learner_compile.py [--model tiny|smollm2] [--prompts 4] [--group 4]
        [--max-new-tokens 64] [--micro-batch-size 8] [--micro-batch-tokens 0] [--packing] [--mode default]
        [--repeats 3] [--threads 0] [--warm-cache] [--record]

The workload of benchmarks/packing.py (prompts of 40 to 80 tokens, response lengths log-uniform up to
``--max-new-tokens``, random token ids), two batches of different widths taken in turn, so that a compiled layer
that recompiled for every width would show it. Three arms alternated ``--repeats`` times on the same weights, each an
optimizer step (pi_old from the forward, AdamW at lr 0): ``eager+shared`` (the default learner: each distinct
prompt computed once), ``eager`` (every row whole) and ``compiled`` (every row whole through compiled layers: the
plan turns prompt sharing off under learner.compile). The compiled arm's first step pays the compilation: it is
reported apart (``compile``: that step's seconds less a steady step's) from the steady medians and minima (on a
machine shared with other jobs the minimum is the less disturbed). Also: the graphs dynamo compiled (after the
first step and at the end: equal when no width recompiles), each arm's gradient norm (equal to float32 rounding)
and the CPU's vector flags. Inductor keeps what it compiled in an on-disk cache that a later process may reuse: the
benchmark compiles into a fresh cache directory (a cold compilation, as a new machine pays it) unless
``--warm-cache``. The machine may be shared with other jobs: compare the arms' ratio, measured side by side, not
their seconds across runs.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile

import torch
from packing import load, step, varied_batch
from records import add_record_argument, store

from grpoplus.learner.compiling import compiled_graphs
from grpoplus.models.device import cpuinfo


def cpu_flags() -> str:
    """The vector-extension flags of this CPU (avx2, avx512*, amx*) from /proc/cpuinfo; empty elsewhere."""
    return " ".join(sorted(f for f in set(cpuinfo("flags").split()) if f.startswith(("avx2", "avx512", "amx", "fma"))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--micro-batch-tokens", type=int, default=0)
    parser.add_argument("--packing", action="store_true", help="packed micro-batches in every arm")
    parser.add_argument("--mode", default="default", choices=["default", "max-autotune-no-cudagraphs"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--warm-cache", action="store_true", help="use inductor's usual on-disk cache")
    add_record_argument(parser)
    args = parser.parse_args()
    if not args.warm_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="grpoplus-inductor-")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, vocab = load(args.model)
    model.train()
    batches = [varied_batch(vocab, args.prompts, args.group, args.max_new_tokens, seed=s) for s in (0, 1)]
    print(f"model {args.model}, {len(batches[0].group_ids)} rows, widths "
          f"{[int(b.response_mask.sum(1).max()) for b in batches]} response tokens, packing {args.packing}, torch "
          f"{torch.__version__}, threads {torch.get_num_threads()}, cpu count {os.cpu_count()}\ncpu flags: {cpu_flags()}")
    arms = {"eager+shared": dict(share_prompts=True), "eager": dict(share_prompts=False),
            "compiled": dict(share_prompts=False, compile=args.mode)}
    arms = {name: {**arm, "packing": args.packing} for name, arm in arms.items()}
    step(copy.deepcopy(model), batches[0], arms["eager"], args)  # warm-up (allocator, kernels)
    first, _ = step(model, batches[0], arms["compiled"], args)
    graphs_first = compiled_graphs()
    times: dict[str, list[float]] = {name: [] for name in arms}
    norms: dict[str, list[float]] = {name: [] for name in arms}  # lr 0: the same weights, the same gradient
    for i in range(args.repeats):
        for name, arm in arms.items():
            seconds, metrics = step(model, batches[i % 2], arm, args)
            times[name].append(seconds)
            norms[name].append(metrics["optim/grad_norm"])
    for name in arms:
        t = statistics.median(times[name])
        print(f"{name:>12}: {t:7.3f} s/step median, {min(times[name]):7.3f} min of {args.repeats} "
              f"({' '.join(f'{x:.2f}' for x in times[name])})")
    print(f"gradient norms: {' '.join(f'{x:.6f}' for x in norms['eager'])} eager, largest relative difference "
          + ", ".join(f"{name} {max(abs(a / b - 1) for a, b in zip(norms[name], norms['eager'])):.1e}" for name in arms))
    steady = statistics.median(times["compiled"])
    print(f"compile: {first - steady:.1f} s (first compiled step {first:.1f} s); graphs {graphs_first} after it, "
          f"{compiled_graphs()} at the end ({'warm' if args.warm_cache else 'cold'} cache); eager / compiled step time "
          f"{statistics.median(times['eager']) / steady:.2f}x median, {min(times['eager']) / min(times['compiled']):.2f}x "
          f"min; eager+shared / compiled {statistics.median(times['eager+shared']) / steady:.2f}x median")
    store("learner_compile", {"model": args.model, "packing": args.packing, "mode": args.mode,
                              "threads": torch.get_num_threads(), "cold_cache": not args.warm_cache,
                              "compile_s": round(first - steady, 1), "graphs": [graphs_first, compiled_graphs()],
                              "seconds": {name: [round(x, 3) for x in times[name]] for name in arms},
                              "grad_norm_rel_diff": {name: max(abs(a / b - 1) for a, b in zip(norms[name], norms["eager"]))
                                                     for name in arms}}, args.record)


def ratios_table(figures: dict) -> str:
    """One row per call of a record (``benchmarks/records.py learner_compile "python ..." ...``, or one call's own
    record): the steady step's ratios, the compilation's seconds and the graphs compiled."""
    calls = [v for call in figures["calls"] for v in call["printed"] if "seconds" in v] if "calls" in figures \
        else [figures]
    lines = ["| model | rows | eager / compiled | default (eager+shared) / compiled | compilation s (cache) | "
             "graphs after the first step, at the end |", "|---|---|---:|---:|---:|---|"]
    for c in calls:
        med = {name: statistics.median(t) for name, t in c["seconds"].items()}
        lines.append(f"| {c['model']} | {'packed' if c['packing'] else 'padded'} | "
                     f"{med['eager'] / med['compiled']:.2f}x | {med['eager+shared'] / med['compiled']:.2f}x | "
                     f"{c['compile_s']:.0f} ({'cold' if c['cold_cache'] else 'warm'}) | {c['graphs'][0]}, "
                     f"{c['graphs'][1]} |")
    return "\n".join(lines)


VIEWS = {"table": ratios_table}
"""What a page renders from a record (``benchmarks/render.py``)."""


if __name__ == "__main__":
    main()
