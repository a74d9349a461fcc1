"""Rollout throughput of grpoplus's HF engine vs ``model.generate`` on the same batch.

The "small" tiny model (fp32, CPU), arithmetic prompts, sampling at temperature 1.
Prints one JSON line per shape (rows x max new tokens) with generated tokens per second
for both and their ratio.

    OMP_NUM_THREADS=1 python benchmarks/rollout_speed.py --repeats 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rollout import HFEngine, SamplingParams
from grpoplus.tasks import get_task

SHAPES = ((32, 8), (128, 32))  # (completions, max new tokens)
GROUP = 8


def median_seconds(fns: dict, repeats: int) -> dict[str, tuple[float, int]]:
    """Median wall-clock seconds of each ``fn()`` and the tokens it generated.

    The contenders run in turn (after one warm-up call each), so load from other
    processes on a shared machine falls on both alike.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    tokens = {name: fn() for name, fn in fns.items()}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            tokens[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), tokens[name]) for name in fns}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tok = char_tokenizer()
    model = tiny_model(tok, size="small").eval()
    engine = HFEngine(model, tok)
    task = get_task("arithmetic", difficulty=2, seed=0, n_train=256, n_test=1)
    for rows, new_tokens in SHAPES:
        prompts = [e.prompt for e in list(task.split("train"))[: rows // GROUP]]
        params = SamplingParams(n=GROUP, temperature=1.0, max_new_tokens=new_tokens)
        generator = torch.Generator().manual_seed(0)

        def ours() -> int:
            return int(engine.generate(prompts, params, generator=generator).response_mask.sum())  # noqa: B023

        enc = tok(prompts, padding=True, return_tensors="pt")
        enc = {k: v.repeat_interleave(GROUP, 0) for k, v in enc.items()}

        def hf_generate() -> int:
            with torch.inference_mode():
                out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,  # noqa: B023
                                     max_new_tokens=new_tokens)  # noqa: B023 (each closure runs in its iteration)
            new = out[:, enc["input_ids"].shape[1]:]  # noqa: B023
            # Count up to and including the first EOS of each row, as the engine does.
            ended = (new == tok.eos_token_id).long().cumsum(1)
            return int(((ended == 0) | ((ended == 1) & (new == tok.eos_token_id))).sum())

        result = median_seconds({"ours": ours, "generate": hf_generate}, args.repeats)
        (t_ours, n_ours), (t_hf, n_hf) = result["ours"], result["generate"]
        print(json.dumps({
            "shape": f"{rows}x{new_tokens}", "params": sum(p.numel() for p in model.parameters()),
            "threads": args.threads, "grpoplus_tokens_per_s": round(n_ours / t_ours),
            "generate_tokens_per_s": round(n_hf / t_hf), "speedup": round((n_ours / t_ours) / (n_hf / t_hf), 2),
            "grpoplus_s": round(t_ours, 4), "generate_s": round(t_hf, 4),
        }))


if __name__ == "__main__":
    main()
