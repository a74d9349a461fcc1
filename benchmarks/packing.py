"""Packed micro-batches (learner.packing) against padded ones: one learner step side by side, in one process.

    python benchmarks/packing.py [--model tiny|smollm2] [--prompts 4] [--group 4] [--max-new-tokens 256]
                                 [--micro-batch-size 16] [--micro-batch-tokens 0] [--repeats 3] [--threads 0]
                                 [--record]

A synthetic batch whose response lengths vary widely, as a task that makes the model work gives them with
``max_new_tokens=256``: per row a length drawn log-uniformly from 4 to ``--max-new-tokens`` (a few long
reasoning traces among many short answers), prompts of 40 to 80 tokens, ``--group`` responses per prompt. Random
token ids (the speed of a forward and backward does not depend on them). Four arms, alternated ``--repeats``
times on the same weights: ``padded+shared`` (learner.packing=off: padded rows, each distinct prompt computed
once), ``padded`` (every row whole), ``packed`` (learner.packing=on) and ``auto`` (each micro-batch packed where
that computes less). Each runs one optimizer step (pi_old
from the forward, AdamW at lr 0 so the weights stay put) and reports its median seconds, the padding fraction of
its forwards (``learner/pad_frac``) and its loss, which must agree across the arms to float32 rounding.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import statistics
import time

import torch
from records import add_record_argument, store

from grpoplus.algo import AlgoConfig
from grpoplus.containers import TrainBatch
from grpoplus.learner.prepare import LearnerPlan
from grpoplus.learner.update import optimizer_step

ARMS = {"padded+shared": dict(share_prompts=True), "padded": dict(share_prompts=False),
        "packed": dict(share_prompts=False, packing=True), "auto": dict(share_prompts=True, packing="auto")}


def load(name: str):
    """(model, vocabulary size) of ``--model``."""
    if name == "smollm2":
        from grpoplus.models.load import SMOLLM2, load_policy

        model, tok = load_policy(SMOLLM2)
        return model, len(tok)
    from grpoplus.models.tiny import tiny_model
    from grpoplus.models.tokenizer import char_tokenizer

    tok = char_tokenizer()
    return tiny_model(tok, size="small", seed=0), len(tok)


def varied_batch(vocab: int, prompts: int, group: int, max_new: int, seed: int = 0) -> TrainBatch:
    """Left-padded prompts of 40-80 tokens, right-padded responses of log-uniform lengths in [4, max_new]."""
    g = torch.Generator().manual_seed(seed)
    n, p = prompts * group, 80
    plen = torch.randint(40, p + 1, (prompts,), generator=g).repeat_interleave(group)
    rlen = torch.exp(torch.empty(n).uniform_(math.log(4), math.log(max_new), generator=g)).long().clamp(4, max_new)
    pm = (torch.arange(p)[None] >= p - plen[:, None]).long()
    rm = (torch.arange(max_new)[None] < rlen[:, None]).float()
    pid = torch.randint(5, vocab, (prompts, p), generator=g).repeat_interleave(group, 0) * pm
    rid = torch.randint(5, vocab, (n, max_new), generator=g) * rm.long()
    logp_roll = -torch.rand(n, max_new, generator=g) * rm
    return TrainBatch(pid, pm, rid, rm, rm.clone(), torch.randn(n, generator=g), logp_roll, None, None,
                      torch.arange(n) // group)


def step(model, batch: TrainBatch, arm: dict, args) -> tuple[float, dict]:
    """Seconds and metrics of one optimizer step of ``arm``."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.0)
    plan = LearnerPlan(temperature=1.0, micro_batch_size=args.micro_batch_size, max_grad_norm=1.0, logp_old="forward",
                       micro_batch_tokens=args.micro_batch_tokens,
                       **arm)
    algo = AlgoConfig.preset("grpo", beta=0.0, max_len=args.max_new_tokens)
    start = time.perf_counter()
    metrics, _, _ = optimizer_step(model, opt, batch, algo, plan)
    return time.perf_counter() - start, metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=16)
    parser.add_argument("--micro-batch-tokens", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    add_record_argument(parser)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, vocab = load(args.model)
    model.train()
    batch = varied_batch(vocab, args.prompts, args.group, args.max_new_tokens)
    lengths = batch.response_mask.sum(1)
    print(f"model {args.model}, {len(lengths)} rows, response lengths {int(lengths.min())}-{int(lengths.max())} "
          f"(median {int(lengths.median())}), torch threads {torch.get_num_threads()}, cpu count {os.cpu_count()}")
    times: dict[str, list[float]] = {name: [] for name in ARMS}
    metrics: dict[str, dict] = {}
    step(copy.deepcopy(model), batch, ARMS["padded"], args)  # warm-up (allocator, kernels)
    for _ in range(args.repeats):
        for name, arm in ARMS.items():
            seconds, metrics[name] = step(model, batch, arm, args)
            times[name].append(seconds)
    base = statistics.median(times["padded+shared"])
    for name in ARMS:
        m, t = metrics[name], statistics.median(times[name])
        print(f"{name:>14}: {t:7.3f} s/step (median of {args.repeats}; {' '.join(f'{x:.2f}' for x in times[name])})"
              f"  pad_frac {m['learner/pad_frac']:.3f}  loss {m['loss/total']:+.6f}  speedup vs padded+shared "
              f"{base / t:.2f}x")
    print(f"padding fraction before/after packing: {metrics['packed']['learner/pad_frac_padded']:.3f} -> "
          f"{metrics['packed']['learner/pad_frac']:.3f}; packed / padded time ratio "
          f"{statistics.median(times['packed']) / statistics.median(times['padded']):.2f}, packed / padded+shared "
          f"{statistics.median(times['packed']) / base:.2f}")
    store("packing", {"model": args.model, "rows": len(lengths), "response_lengths": [int(lengths.min()),
                      int(lengths.median()), int(lengths.max())], "threads": torch.get_num_threads(),
                      "pad_frac_padded": round(metrics["packed"]["learner/pad_frac_padded"], 3),
                      "arms": {name: {"seconds": [round(x, 3) for x in times[name]],
                                      "pad_frac": round(metrics[name]["learner/pad_frac"], 3),
                                      "loss": metrics[name]["loss/total"]} for name in ARMS}}, args.record)


def arms_table(figures: dict) -> str:
    """Per arm: the step's median seconds (each repeat's), its padding and loss, and the default's time over it."""
    base = statistics.median(figures["arms"]["padded+shared"]["seconds"])
    lo, med, hi = figures["response_lengths"]
    lines = [f"{figures['model']}, {figures['rows']} rows, responses of {lo}-{hi} tokens (median {med}), "
             f"{figures['threads']} torch thread(s):", "",
             "| arm | s/step, median (each repeat) | padding | loss | `padded+shared` / arm |",
             "|---|---:|---:|---:|---:|"]
    for name, arm in figures["arms"].items():
        t = statistics.median(arm["seconds"])
        lines.append(f"| `{name}` | {t:.2f} ({', '.join(f'{x:.2f}' for x in arm['seconds'])}) | "
                     f"{100 * arm['pad_frac']:.0f}% | {arm['loss']:+.6f} | {base / t:.2f}x |")
    return "\n".join(lines)


VIEWS = {"table": arms_table}
"""What a page renders from a record (``benchmarks/render.py``)."""


if __name__ == "__main__":
    main()
