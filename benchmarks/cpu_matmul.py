"""Float32 GEMMs of SmolLM2-135M's learner on a CPU: torch's BLAS against oneDNN (learner.cpu_matmul), alternated.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/cpu_matmul.py [--threads 1 2] [--rows 768]

For each product of a decoder layer (q/o 576->576, k/v 576->192, gate/up 576->1536, down 1536->576) and of the LM
head (576->49152: its forward in chunks of 341 rows, its backward over all rows at once, as
grpoplus/learner/logprobs.py computes them), the forward ``Y = X W^T`` and the backward's ``dX = dY W`` and
``dW = dY^T X`` at ``--rows`` tokens (768: the 16 responses of 48 tokens of benchmarks/smollm2_vs_trl.py), timed
by torch (``X @ W.T``: MKL in the x86 wheels) and by :func:`grpoplus.models.cpu_matmul` (oneDNN), each the best of
``--repeats`` rounds, the two alternated in one process. One JSON line per thread count: which library
``learner.cpu_matmul=auto`` picks on this machine and why (``auto_why``), GFLOP/s of each product by each library,
the layer-weighted totals (seconds for one forward and backward of 30 layers and the head), the CPU's vendor and
flags, and the largest difference between the two products' results (float32 rounding).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from decode_floor import cpu_flags  # noqa: E402

from grpoplus.models import cpu_matmul  # noqa: E402

HIDDEN, KV, MLP, VOCAB, LAYERS = 576, 192, 1536, 49152, 30
HEAD_ROWS = (1 << 24) // VOCAB  # the head's forward chunk (logprobs.CHUNK_ELEMENTS // V)
LAYER = {"q_proj": (HIDDEN, HIDDEN, 1), "k_v_proj": (HIDDEN, KV, 2), "o_proj": (HIDDEN, HIDDEN, 1),
         "gate_up_proj": (HIDDEN, MLP, 2), "down_proj": (MLP, HIDDEN, 1)}


def best_of(fn, repeats: int, inner: int = 5) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - t0) / inner)
    return best


def products(rows: int, k: int, n: int) -> dict:
    """The three products of one linear layer [k -> n] at ``rows`` rows: (a, b) for ``a @ b``."""
    x, w, dy = torch.randn(rows, k), torch.randn(n, k), torch.randn(rows, n)
    return {"forward": (x, w.T), "d_input": (dy, w), "d_weight": (dy.T, x)}


def measure(rows: int, repeats: int) -> dict:
    shapes = {name: (k, n, count * LAYERS) for name, (k, n, count) in LAYER.items()}
    shapes["lm_head"] = (HIDDEN, VOCAB, 1)
    out, seconds, worst = {}, {"torch": 0.0, "onednn": 0.0}, 0.0
    for name, (k, n, layers) in shapes.items():
        for kind, (a, b) in products(rows, k, n).items():
            count = layers
            if name == "lm_head" and kind == "forward":  # chunks of HEAD_ROWS rows: the last one's cost as a full one's
                a, count = a[:HEAD_ROWS], -(-rows // HEAD_ROWS)
            flop = 2 * a.shape[0] * a.shape[1] * b.shape[1]
            t_torch = best_of(lambda a=a, b=b: a @ b, repeats)
            t_dnn = best_of(lambda a=a, b=b: cpu_matmul.mm(a, b), repeats)
            worst = max(worst, float((cpu_matmul.mm(a, b) - a @ b).abs().max() / (a @ b).abs().max()))
            out[f"{name}.{kind}"] = {"torch_gflops": round(flop / t_torch / 1e9, 1),
                                     "onednn_gflops": round(flop / t_dnn / 1e9, 1)}
            seconds["torch"] += t_torch * count
            seconds["onednn"] += t_dnn * count
    return {"products": out, "torch_s": round(seconds["torch"], 3), "onednn_s": round(seconds["onednn"], 3),
            "speedup": round(seconds["torch"] / seconds["onednn"], 2), "max_rel_diff": worst}


def _thread_runs(figures: dict) -> list[dict]:
    """The JSON line of each thread count, from a record of ``benchmarks/records.py cpu_matmul "python ..."``."""
    return [v for call in figures["calls"] for v in call["printed"] if "threads" in v]


def totals_table(figures: dict) -> str:
    """Per thread count: one forward and backward's products by each library, the ratio, and what auto picks."""
    lines = ["| threads | rows | every product of a forward and backward, torch | the same, oneDNN | oneDNN / torch "
             "per product | largest relative difference | `auto` picks |", "|---:|---:|---:|---:|---|---:|---|"]
    for run in _thread_runs(figures):
        ratios = [p["onednn_gflops"] / p["torch_gflops"] for p in run["products"].values()]
        lines.append(f"| {run['threads']} | {run['rows']} | {run['torch_s']:.2f} s | {run['onednn_s']:.2f} s "
                     f"({run['speedup']:.2f}x) | {min(ratios):.2f}-{max(ratios):.2f}x | {run['max_rel_diff']:.1e} | "
                     f"{'oneDNN' if run['auto_uses_onednn'] else 'torch'} ({run['vendor']}) |")
    return "\n".join(lines) + "\n"


def products_table(figures: dict) -> str:
    """GFLOP/s of each product by each library, per thread count."""
    runs = _thread_runs(figures)
    lines = ["| product | " + " | ".join(f"torch, {r['threads']} thr | oneDNN, {r['threads']} thr" for r in runs)
             + " |", "|---|" + "---:|---:|" * len(runs)]
    for name in runs[0]["products"]:
        lines.append(f"| {name} | " + " | ".join(f"{r['products'][name]['torch_gflops']:.0f} | "
                                                  f"{r['products'][name]['onednn_gflops']:.0f}" for r in runs) + " |")
    return "\n".join(lines) + "\n"


VIEWS = {"totals": totals_table, "products": products_table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rows", type=int, default=768)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if not cpu_matmul.use_cpu_matmul("onednn"):
        raise SystemExit("this torch has no oneDNN linear op: nothing to compare")
    torch.manual_seed(0)
    for threads in args.threads:
        torch.set_num_threads(threads)
        with torch.no_grad():  # as in a backward: cpu_matmul.mm routes only there
            record = measure(args.rows, args.repeats)
        print(json.dumps({"threads": threads, "rows": args.rows, "vendor": cpu_matmul.cpu_vendor(),
                          "auto_uses_onednn": cpu_matmul.uses_onednn("auto"),
                          "auto_why": cpu_matmul.auto_choice(), "torch": torch.__version__,
                          "load_avg_1min": os.getloadavg()[0], "cpu_flags": cpu_flags(), **record}), flush=True)


if __name__ == "__main__":
    main()
