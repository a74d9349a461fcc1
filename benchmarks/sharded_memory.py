"""Per-rank memory of the learner's model state: learner.strategy=replicate vs fsdp2, N gloo ranks on this machine.

Each rank builds its learner exactly as ``grpoplus train learner.data_parallel=N`` does
(rank 0's weights on every rank, then the strategy), runs two updates on the same synthetic
batch (16 responses of 48 tokens after 80-token prompts, the dapo preset), and reports the
bytes it holds of each part of the model state, counted from the tensors themselves
(a sharded parameter's local shard): parameters, gradients (at the optimizer step, their
largest), AdamW moments; and its peak RSS once built (``built_peak_rss_mb``: loading, the weights from
rank 0, sharding) and after the updates. Rank 0 of a sharded learner also holds its plain
copy of the policy for the engines and checkpoints: reported apart (``mirror_mb``), as is the frozen
reference of ``beta > 0`` (``reference_mb``)::

    python benchmarks/sharded_memory.py --model /tmp/smollm2-hf --strategy replicate
    python benchmarks/sharded_memory.py --model /tmp/smollm2-hf --strategy fsdp2
    python benchmarks/sharded_memory.py --model /tmp/smollm2-hf --strategy fsdp2 precision=bf16_mixed

One JSON line per rank, then a summary line with the largest rank's figures. The three calls above, stored as one
record that ``docs/results/scaling.md`` renders (:data:`VIEWS`)::

    python benchmarks/records.py sharded_memory \
        "python benchmarks/sharded_memory.py --model M --strategy replicate" \
        "python benchmarks/sharded_memory.py --model M --strategy fsdp2" \
        "python benchmarks/sharded_memory.py --model M --strategy fsdp2 precision=bf16_mixed"
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys

import torch
import torch.multiprocessing as mp

PROMPT, RESPONSE, ROWS, GROUP = 80, 48, 16, 4


def local_bytes(tensors) -> int:
    """Bytes held on this rank: a DTensor's local shard, a plain tensor whole."""
    from torch.distributed.tensor import DTensor

    total = 0
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        total += local.numel() * local.element_size()
    return total


def synthetic_batch(vocab: int, with_logp_old: bool, with_logp_ref: bool = False, seed: int = 0):
    from grpoplus.containers import TrainBatch

    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, vocab, (ROWS // GROUP, PROMPT), generator=g).repeat_interleave(GROUP, 0)
    responses = torch.randint(0, vocab, (ROWS, RESPONSE), generator=g)
    ones, logp = torch.ones(ROWS, RESPONSE), -torch.rand(ROWS, RESPONSE, generator=g)
    return TrainBatch(prompts, torch.ones_like(prompts), responses, ones, ones.clone(),
                      torch.randn(ROWS, generator=g), logp, logp.clone() if with_logp_old else None,
                      logp.clone() if with_logp_ref else None,
                      torch.arange(ROWS // GROUP).repeat_interleave(GROUP))


def rank_main(rank: int, world: int, port: int, overrides: list[str], out: "mp.Queue") -> None:
    from grpoplus.assemble.learner import build_learner_rank_parts, build_rank_model
    from grpoplus.config import build_config
    from grpoplus.distributed.group import RankGroup, Rendezvous
    from grpoplus.distributed.learner import update_step
    from grpoplus.plan import resolve

    torch.set_num_threads(1)
    cfg = build_config("dapo", overrides=[f"data_parallel={world}", *overrides])
    model = build_rank_model(resolve(cfg).learner, "cpu", rank)
    group = RankGroup.join(Rendezvous(f"tcp://127.0.0.1:{port}", rank, world, "cpu", 600.0))
    parts, plan = build_learner_rank_parts(resolve(cfg).learner, model, group)
    built_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    trained = [p for p in parts.model.parameters() if p.requires_grad]
    grads = []
    parts.optimizer.register_step_pre_hook(lambda *_: grads.append(local_bytes(p.grad for p in trained
                                                                             if p.grad is not None)))
    batch = synthetic_batch(parts.model.config.vocab_size, with_logp_old=not plan.logp_old_from_forward,
                            with_logp_ref=cfg.algo.beta > 0)
    for step in (1, 2):
        update_step(parts, batch, step, cfg.algo, plan)
    moments = [t for state in parts.optimizer.state.values() for t in state.values()
               if isinstance(t, torch.Tensor) and t.dim() > 0]
    mb = 1 << 20
    record = {"rank": rank, "strategy": cfg.learner.strategy, "precision": cfg.learner.precision,
              "params_mb": local_bytes(parts.model.parameters()) / mb, "grads_mb": max(grads) / mb,
              "adam_mb": local_bytes(moments) / mb,
              "mirror_mb": 0.0 if parts.mirror is None else local_bytes(parts.mirror.parameters()) / mb,
              "reference_mb": 0.0 if parts.ref_model is None else local_bytes(parts.ref_model.parameters()) / mb,
              "built_peak_rss_mb": built_rss, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    record["model_state_mb"] = record["params_mb"] + record["grads_mb"] + record["adam_mb"]
    out.put(record)
    group.close()


def _calls(figures: dict) -> list[tuple[list[dict], dict, dict]]:
    """Per call of a record: its ranks' lines, the rank holding the most model state, and its summary line."""
    out = []
    for call in figures["calls"]:
        ranks = [v for v in call["printed"] if "rank" in v]
        out.append((ranks, max(ranks, key=lambda r: r["model_state_mb"]), call["printed"][-1]))
    return out


def strategies_table(figures: dict) -> str:
    """The results page's table from a record of several calls (:func:`records.run_recorded`): per call, each part
    of the largest rank's model state, against the first call's, and every rank's peak RSS."""
    lines = ["| strategy | parameters | gradients | AdamW moments | model state per rank | vs the first row | "
             "rank 0's plain copy | peak RSS per rank |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    first = None
    for ranks, top, summary in _calls(figures):
        first = first or top["model_state_mb"]
        name = " ".join([f"`{summary['summary']}`", *(f"`{o}`" for o in summary["overrides"])])
        mirror = f"{ranks[0]['mirror_mb']:.0f} MB" if ranks[0]["mirror_mb"] else "-"
        rss = " / ".join(f"{r['peak_rss_mb'] / 1024:.2f}" for r in sorted(ranks, key=lambda r: r["rank"]))
        lines.append(f"| {name} | {top['params_mb']:.0f} MB | {top['grads_mb']:.0f} MB | {top['adam_mb']:.0f} MB | "
                     f"{top['model_state_mb']:.0f} MB | {top['model_state_mb'] / first:.2f}x | {mirror} | {rss} GB |")
    return "\n".join(lines)


def state_plot(figures: dict) -> dict:
    """The largest rank's model state per call, split into parameters, gradients and AdamW moments (:mod:`plots`)."""
    labels, parts = [], {"parameters": [], "gradients": [], "AdamW moments": []}
    for _, top, summary in _calls(figures):
        labels.append(" ".join([summary["summary"], *summary["overrides"]]))
        for part, key in zip(parts, ("params_mb", "grads_mb", "adam_mb")):
            parts[part].append(round(top[key], 1))
    return {"kind": "stacked", "title": "SmolLM2-135M learner: model state per rank, 2 ranks", "labels": labels,
            "unit": "MB per rank", "series": parts}


def loading_table(figures: dict) -> str:
    """Per call of a record: what each rank holds once the model is built (its parameters, and its reference where
    a call has one), and its peak RSS then, rank by rank."""
    calls = _calls(figures)
    ref = any(r["reference_mb"] for ranks, _, _ in calls for r in ranks)
    lines = ["| strategy | rank | parameters held |" + (" reference held |" if ref else "")
             + " rank 0's plain copy | peak RSS once built |", "|---|---:|---:|" + ("---:|" if ref else "") + "---:|---:|"]
    for ranks, _, summary in calls:
        name = " ".join([f"`{summary['summary']}`", *(f"`{o}`" for o in summary["overrides"])])
        lines += [f"| {name} | {r['rank']} | {r['params_mb']:.0f} MB |" + (f" {r['reference_mb']:.0f} MB |" if ref else "")
                  + f" {r['mirror_mb']:.0f} MB | {r['built_peak_rss_mb']:.0f} MB |"
                  for r in sorted(ranks, key=lambda r: r["rank"])]
    return "\n".join(lines)


VIEWS = {"table": strategies_table, "loading": loading_table}
"""What a page renders from a record (``benchmarks/render.py``)."""
PLOTS = {"state": state_plot}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a Hugging Face model dir (or smollm2)")
    parser.add_argument("--strategy", choices=("replicate", "fsdp2"), default="fsdp2")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("overrides", nargs="*", help="further config overrides (key=value)")
    args = parser.parse_args()
    from grpoplus.distributed.group import free_port

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    overrides = [f"model={args.model}", f"strategy={args.strategy}", "micro_batch_size=4", *args.overrides]
    ctx = mp.get_context("spawn")
    queue, port = ctx.Queue(), free_port()
    procs = [ctx.Process(target=rank_main, args=(r, args.ranks, port, overrides, queue)) for r in range(args.ranks)]
    for proc in procs:
        proc.start()
    records = sorted((_result(queue, procs) for _ in procs), key=lambda r: r["rank"])
    for proc in procs:
        proc.join()
    for record in records:
        print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in record.items()}))
    top = max(records, key=lambda r: r["model_state_mb"])
    print(json.dumps({"summary": args.strategy, "ranks": args.ranks, "overrides": args.overrides,
                      "largest_rank_model_state_mb": round(top["model_state_mb"], 1),
                      "largest_rank_peak_rss_mb": round(max(r["peak_rss_mb"] for r in records), 1)}))
    sys.stdout.flush()


def _result(queue: "mp.Queue", procs: list) -> dict:
    """The next rank's record; a rank that exited without one ends the benchmark (its traceback is above)."""
    import queue as queues

    while True:
        try:
            return queue.get(timeout=5)
        except queues.Empty:
            if any(proc.exitcode not in (None, 0) for proc in procs):
                sys.exit("a rank failed (see its traceback above)")


if __name__ == "__main__":
    main()
