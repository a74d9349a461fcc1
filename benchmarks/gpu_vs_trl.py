"""One GPU, side by side: TRL's GRPOTrainer (1.16) against grpoplus, on Qwen2.5-shaped random models.

What it measures: the time of one GRPO step (sample, score, one optimizer update) on each side, split
into rollout and learner, their throughputs, the learner's MFU and the peak memory. The work is the same
on both sides:

- the policy: a randomly initialised Qwen2 of the Qwen2.5-0.5B or Qwen2.5-1.5B shape (``tiny`` for a CPU
  rehearsal), vocabulary = the tokenizer's (SmolLM2's: 49152), float32 master weights, bf16 autocast
  (TRL ``bf16=True``; grpoplus ``learner.precision=bf16_mixed``). ``save`` builds it once on the device
  from the seed and writes it with the tokenizer; both sides load that directory, so they start from the
  same weights;
- every completion runs to ``--new-tokens``: ``save`` adds one special token ``<|never|>`` to the tokenizer
  and makes it the only EOS (tokenizer and ``generation_config``), while the model's vocabulary stays the
  original size, so no side can ever sample it (both only compare sampled ids against it);
- ``--prompts`` prompts (the ``arithmetic`` task's training problems, plain text) x ``--group`` completions
  of ``--new-tokens`` tokens at temperature 1; reward :func:`completion_chars` (the completion's length in
  characters, so groups have spread); one optimizer update per batch (TRL: ``steps_per_generation`` =
  ``gradient_accumulation_steps``, so it never recomputes old log-probs; grpoplus: ``num_minibatches=1
  num_iterations=1``); no KL (beta 0); token-mean loss (TRL's default ``loss_type="dapo"``; grpoplus: the
  dapo preset without dynamic sampling or overlong shaping, eps_high 0.2 = TRL's epsilon_high default);
  AdamW at lr 1e-6; no vLLM (TRL samples with ``model.generate``, grpoplus with its hf engine);
- gradient checkpointing on both sides (TRL's default; ``--gradient-checkpointing off`` turns it off on both).

Each side runs in its own process and prints one JSON line: the median seconds per step after ``--warmup``
steps (min, max), the rollout and learner seconds (TRL: ``model.generate`` timed, the learner = the rest of
the step, scoring included; grpoplus: its ``time/rollout_s`` and ``time/learner_s``), rollout tokens/s
(completion tokens / rollout s), learner tokens/s (every row's prompt + completion tokens / learner s), the
learner MFU (6 x params x tokens the learner forwards / learner s / peak, where peak is the bf16 matmul rate
:func:`matmul_tflops` measures in the same process before the run; grpoplus forwards each group's prompt once,
``learner.share_prompts``), ``mean_completion_tokens`` (must equal ``--new-tokens``) and the peak memory
(``torch.cuda.max_memory_allocated``, and ``peak_reserved_mb``; on a CPU the peak RSS). On the GPU, from the
repository root (the ``bench`` extra installed: trl 1.16, which brings datasets and leaves torch alone)::

    T=/path/to/SmolLM2-135M-Instruct   # only its tokenizer is read
    B="--device cuda --steps 3 --warmup 1"
    python benchmarks/gpu_vs_trl.py save --shape qwen2.5-1.5b --tokenizer $T --device cuda
    for i in 1 2; do   # alternated, so that both sides see the same machine
      python benchmarks/gpu_vs_trl.py trl --shape qwen2.5-1.5b $B >> gpu_runs.jsonl
      python benchmarks/gpu_vs_trl.py grpoplus --shape qwen2.5-1.5b $B >> gpu_runs.jsonl
    done
    python benchmarks/gpu_vs_trl.py summary gpu_runs.jsonl

and the same with ``--shape qwen2.5-0.5b`` where time allows, then ``--shape qwen2.5-7b --lora-rank 16`` (peft's
adapters on every linear layer but the head, alpha 32, on both sides: the common single-GPU setting; its MFU counts
4 flops per parameter and token, the frozen weights getting no gradient). Each call pays its imports, the load of
the saved model and the warm-up step; in a short slot, one round per shape, 1.5B first: all three targets apply
to it. ``save`` writes to ``/tmp/gpu_vs_trl/<shape>`` unless ``--model DIR``: 1.39B parameters = 5.5 GB in
float32 for the 1.5B shape, 0.40B = 1.6 GB for the 0.5B shape, 6.9B = 28 GB for the 7B shape (the 49152-token
vocabulary; with Qwen's own 151936 these shapes have Qwen2.5's 494M, 1.54B and 7.6B). Extra ``key=value`` words
after a ``grpoplus`` call are
grpoplus config overrides, e.g. ``learner.micro_batch_size=32``; ``--trl-micro-batch N`` has TRL accumulate
gradients over N-row micro-batches should all rows at once not fit (still one update per generated batch).
The CPU rehearsal::

    OMP_NUM_THREADS=1 python benchmarks/gpu_vs_trl.py save --shape tiny --tokenizer $T --device cpu
    for side in trl grpoplus; do OMP_NUM_THREADS=1 python benchmarks/gpu_vs_trl.py $side --shape tiny \\
        --device cpu --prompts 2 --group 2 --new-tokens 8 --steps 3 --warmup 1 >> cpu_runs.jsonl; done

``summary`` prints the medians per side and setting, and grpoplus against TRL on each setting with the
targets, PASS or FAIL (the exit status stays 0): steps/s at least 3x TRL's (with LoRA: above TRL's), peak memory at
most TRL's, and on the 1.5B shape a learner MFU of at least 45% and a rollout at least 40% of the decode's floor.

Each record also holds the decode's floor (``decode_floor_s``: every new token reads the weights once in bfloat16
and every row's cache so far, over the copy bandwidth ``copy_gb_s`` measured in the same process;
``rollout_vs_floor`` = floor / rollout seconds, prefill included, so a lower bound of the decode's own fraction) and,
with ``--profile DIR``, one more step under torch.profiler after the measured ones: its table of top kernels and
operators written to ``DIR/<side>-<shape>.txt``, its kernel launches per step and per new token in the record
(:mod:`gpu_profile`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded
os.environ.setdefault("WANDB_DISABLED", "true")
sys.path.append(str(Path(__file__).resolve().parents[1]))  # grpoplus from this source tree when not installed

import torch  # noqa: E402
from gpu_profile import StepProfile, copy_gb_s, decode_floor_s  # noqa: E402
from smollm2_vs_trl import computed_tokens, matmul_gflops_now, peak_rss_mb, spread  # noqa: E402
from trl_peer import StepTimer, peer_prompts  # noqa: E402

SHAPES = {
    # Qwen2.5-0.5B's config.json (attention q/k/v with bias: Qwen2's own layout)
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, rope_theta=1_000_000.0, tie_word_embeddings=True,
                         max_position_embeddings=32768, rms_norm_eps=1e-6),
    # Qwen2.5-1.5B-Instruct's (the base model's says 131072 positions: no effect on the compute)
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, rope_theta=1_000_000.0, tie_word_embeddings=True,
                         max_position_embeddings=32768, rms_norm_eps=1e-6),
    # Qwen2.5-7B-Instruct's (untied embeddings): the single-GPU LoRA setting (--lora-rank 16)
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, rope_theta=1_000_000.0, tie_word_embeddings=False,
                       max_position_embeddings=32768, rms_norm_eps=1e-6),
    "tiny": dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, rope_theta=1_000_000.0, tie_word_embeddings=True,
                 max_position_embeddings=2048, rms_norm_eps=1e-6),
}
NEVER = "<|never|>"
"""The EOS of both sides: a token the model's vocabulary does not hold, so every completion runs full length."""
LR = 1e-6
MEASURES = ("params", "median_s_per_step", "min_s", "max_s", "steps_per_s", "rollout_s", "learner_s", "rollout_tok_s",
            "learner_tok_s", "learner_mfu", "peak_tflops", "peak_mem_mb", "peak_reserved_mb", "mean_completion_tokens",
            "reward_mean", "micro_batch", "wall_s", "copy_gb_s", "decode_floor_s", "rollout_vs_floor",
            "launches_per_step", "launches_per_new_token")
"""The numbers summary takes the medians of."""
TARGETS = {"steps_per_s_ratio": 3.0, "peak_mem_ratio": 1.0, "learner_mfu": 0.45, "rollout_vs_floor": 0.40,
           "mfu_shape": "qwen2.5-1.5b", "lora_steps_per_s_ratio": 1.0}
"""Full fine-tuning: steps/s 3x TRL's; with LoRA (the 7B shape on one GPU) faster than TRL; memory within TRL's."""


def completion_chars(prompts: list[str], completions: list[str], **fields) -> list[float]:
    """The reward of both sides: the completion's length in characters / 1000 (cheap, and it varies in a group).

    >>> completion_chars(["1+1="], ["abc"])
    [0.003]
    """
    return [len(c) / 1000 for c in completions]


def save(shape: str, tokenizer_dir: str, out: str, device: str, seed: int) -> dict:
    """Build the random ``shape`` model on ``device`` from ``seed``; write it (float32) and the tokenizer, whose
    only EOS is the new token ``<|never|>``, one id past the model's vocabulary."""
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    vocab = len(tok)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.convert_tokens_to_ids("<|endoftext|>")
    if pad is None or not 0 <= pad < vocab:
        raise ValueError(f"{tokenizer_dir}: no pad token and no <|endoftext|> to pad with")
    tok.add_special_tokens({"eos_token": NEVER})
    tok.pad_token = tok.convert_ids_to_tokens(pad)
    never = tok.convert_tokens_to_ids(NEVER)
    assert never >= vocab, (never, vocab)
    # the model config names no EOS (transformers warns of one outside the vocabulary); the generation config does
    cfg = Qwen2Config(**SHAPES[shape], vocab_size=vocab, pad_token_id=pad, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=never, pad_token_id=pad)  # the only EOS
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return {"saved": out, "shape": shape, "params": sum(p.numel() for p in model.parameters()), "vocab_size": vocab,
            "eos_id": never, "pad_id": pad, "device": device, "seed": seed}


def matmul_tflops(device: str, dtype: torch.dtype) -> float:
    """The matmul rate (TFLOP/s) this process gets on ``device`` in ``dtype``: 8192^2 matrices on a GPU, 1024^2 on a
    CPU, timed after a warm-up. The MFU's peak: the device's own, measured, not its datasheet's."""
    cuda = device == "cuda"
    size, repeats = (8192, 50) if cuda else (1024, 5)
    rate = matmul_gflops_now(size, repeats, device, dtype, warmup=3) / 1e3
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)  # the side's peak starts after this
    return rate


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_mb(device: str) -> float:
    """Peak GPU memory allocated by torch, or on a CPU the process's peak resident memory."""
    return torch.cuda.max_memory_allocated(device) / 2 ** 20 if device == "cuda" else peak_rss_mb()


def reserved_mb(device: str) -> dict:
    """On a GPU, the peak of what torch's caching allocator held (allocated + cached): what had to fit."""
    return {"peak_reserved_mb": round(torch.cuda.max_memory_reserved(device) / 2 ** 20, 1)} if device == "cuda" else {}


def device_name(device: str) -> str:
    return torch.cuda.get_device_name(device) if device == "cuda" else platform.processor() or "cpu"


class SyncedStepTimer(StepTimer):
    """TRL's optimizer steps, timed with the GPU's queue drained at both ends."""

    def __init__(self, device: str):
        super().__init__()
        self.device = device

    def on_step_begin(self, args, state, control, **kwargs):
        sync(self.device)
        super().on_step_begin(args, state, control, **kwargs)

    def on_step_end(self, args, state, control, **kwargs):
        sync(self.device)
        super().on_step_end(args, state, control, **kwargs)


def timed_generate(model, device: str, calls: list[dict]):
    """``model.generate``, recording each call's seconds and real prompt tokens (TRL samples one batch per step)."""
    generate = model.generate

    def call(*args, **kwargs):
        sync(device)
        t0 = time.perf_counter()
        out = generate(*args, **kwargs)
        sync(device)
        calls.append({"rollout_s": time.perf_counter() - t0, "prompt_tokens": int(kwargs["attention_mask"].sum())})
        return out

    return call


def run_trl(a: argparse.Namespace) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    rows = a.prompts * a.group
    micro = a.trl_micro_batch or rows
    if rows % micro:
        raise SystemExit(f"--trl-micro-batch {micro} must divide prompts x group = {rows}")
    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).to(a.device)
    calls: list[dict] = []
    scored: list[tuple[list[int], list[float]]] = []  # per step: completion tokens, rewards
    model.generate = timed_generate(model, a.device, calls)

    def reward(prompts, completions, completion_ids, **fields):  # the ids TRL trains on, cut at EOS
        scored.append(([len(ids) for ids in completion_ids], completion_chars(prompts, completions)))
        return scored[-1][1]

    timer = SyncedStepTimer(a.device)
    profiled = ProfileStep(a.device, a.steps) if a.profile else None  # one more step, after the measured ones
    with tempfile.TemporaryDirectory() as out_dir:
        # one optimizer step per generated batch: generation_batch_size = micro x steps_per_generation = rows
        config = GRPOConfig(
            output_dir=out_dir, use_cpu=a.device == "cpu", max_steps=a.steps + bool(profiled),
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=rows // micro, steps_per_generation=rows // micro, num_iterations=1,
            num_generations=a.group, max_completion_length=a.new_tokens, temperature=1.0, learning_rate=LR,
            beta=0.0, loss_type="dapo", use_vllm=False, gradient_checkpointing=a.gradient_checkpointing == "on",
            bf16=a.precision == "bf16", fp16=False, logging_steps=10 ** 6, save_strategy="no", report_to="none",
            dataloader_num_workers=0, seed=a.seed, disable_tqdm=True)
        trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, processing_class=tok,
                              callbacks=[timer] + ([profiled] if profiled else []), peft_config=lora_config(a),
                              train_dataset=Dataset.from_dict({"prompt": peer_prompts(5000)[0]}))
        trainer.train()
    if len(calls) != config.max_steps:  # TRL's semantics, checked: one generated batch per optimizer step
        raise RuntimeError(f"TRL generated {len(calls)} batches in {config.max_steps} optimizer steps")
    profile = {}
    if profiled:
        profile = profile_record(profiled.profile, a, "trl")
        timer.times, calls, scored = timer.times[:a.steps], calls[:a.steps], scored[:a.steps]
    steps = [{"step_s": s, "rollout_s": c["rollout_s"], "learner_s": s - c["rollout_s"],
              "completion_tokens": sum(n), "rows": len(n), "prompt_tokens": c["prompt_tokens"],
              "forwarded_tokens": c["prompt_tokens"] + sum(n),  # TRL forwards every row's prompt
              "reward": statistics.mean(r)} for s, c, (n, r) in zip(timer.times, calls, scored)]
    return {"side": "trl", "trl_version": __import__("trl").__version__, "micro_batch": micro,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "steps_per_generation": config.steps_per_generation, **measures(steps, timer.times, a, model), **profile}


def lora_config(a: argparse.Namespace):
    """TRL's adapters for ``--lora-rank``: peft's LoRA on every linear layer but the head, alpha 2 x rank, no dropout,
    as grpoplus's ``learner.lora_rank`` (with ``learner.lora_alpha`` set to match); None for full fine-tuning."""
    if not a.lora_rank:
        return None
    from peft import LoraConfig

    return LoraConfig(r=a.lora_rank, lora_alpha=2 * a.lora_rank, lora_dropout=0.0, target_modules="all-linear",
                      bias="none", task_type="CAUSAL_LM")


def grpoplus_config(a: argparse.Namespace, out: str, overrides: list[str]):
    from grpoplus.config import build_config

    micro = a.micro_batch or (64 if a.gradient_checkpointing == "on" else 16)
    return build_config("dapo", overrides=[
        f"model={a.model}", "task=arithmetic", f"data.rewards=[{Path(__file__).resolve()}:completion_chars]",
        f"prompts_per_step={a.prompts}", f"group_size={a.group}", f"max_new_tokens={a.new_tokens}",
        "temperature=1.0", "dynamic_sampling=false", "overlong_shaping=false", "eps_high=0.2",
        "num_minibatches=1", "num_iterations=1",  # one update per batch (the dapo preset takes 4)
        f"lr={LR}", "warmup_steps=0", "lr_schedule=constant", f"max_steps={a.steps}", "eval_every=0",
        "save_every=0", f"out={out}", "progress=false",
        f"seed={a.seed}", f"learner.device={a.device}", f"learner.micro_batch_size={micro}",
        f"learner.precision={'bf16_mixed' if a.precision == 'bf16' else 'fp32'}",
        f"learner.gradient_checkpointing={'true' if a.gradient_checkpointing == 'on' else 'false'}",
        *([f"learner.lora_rank={a.lora_rank}", f"learner.lora_alpha={2 * a.lora_rank}"] if a.lora_rank else []),
        *overrides])


def run_grpoplus(a: argparse.Namespace, overrides: list[str]) -> dict:
    from grpoplus.assemble import assemble
    from grpoplus.plan import resolve

    with tempfile.TemporaryDirectory(prefix="grpoplus-gpu-bench-") as out:
        cfg = grpoplus_config(a, out, overrides)
        c = assemble(resolve(cfg))
        try:
            return grpoplus_steps(a, cfg, c, overrides)
        finally:
            c.close()


def grpoplus_steps(a: argparse.Namespace, cfg, c, overrides: list[str]) -> dict:
    from grpoplus.loop.driver import train_step

    times, steps = [], []
    for step in range(1, a.steps + 1):
        sync(a.device)
        t0 = time.perf_counter()
        metrics, scored = train_step(c, step)
        sync(a.device)
        times.append(time.perf_counter() - t0)
        r = scored.rollouts
        steps.append({"rollout_s": metrics["time/rollout_s"], "learner_s": metrics["time/learner_s"],
                      "completion_tokens": int(r.response_mask.sum()), "rows": r.response_mask.shape[0],
                      "prompt_tokens": int(r.prompt_mask.sum()), "reward": metrics["reward/mean"],
                      "forwarded_tokens": computed_tokens(r, cfg.learner.share_prompts)})
    profile = {}
    if a.profile:  # one more step, after the measured ones
        with StepProfile(a.device) as profiled:
            train_step(c, a.steps + 1)
        profile = profile_record(profiled, a, "grpoplus")
    model = c.learner.parts.model
    plan = getattr(c.learner, "plan", None)  # learner.micro_batch_size=auto: the token budget sized on the device
    micro = {"micro_batch_tokens": plan.micro_batch_tokens} if cfg.learner.micro_batch_size == "auto" and plan else {}
    rows = cfg.learner.micro_batch_size if isinstance(cfg.learner.micro_batch_size, int) else 0
    return {"side": "grpoplus", "overrides": " ".join(overrides), "micro_batch": rows, **micro,
            **measures(steps, times, a, model), **profile, **compiler_counts()}


def compiler_counts() -> dict:
    """What torch.compile did in this process: graphs compiled, and graphs compiled without the CUDA graphs asked
    for (``rollout.compile`` on a GPU; 0 when they were captured)."""
    from torch._dynamo.utils import counters

    return {"dynamo_graphs": counters["stats"]["unique_graphs"], "cudagraph_skips": counters["inductor"]["cudagraph_skips"]}


class ProfileStep(StepTimer):
    """TRL's optimizer step number ``step`` (0-based) under the profiler."""

    def __init__(self, device: str, step: int):
        super().__init__()
        self.device, self.step, self.profile = device, step, None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.profile = StepProfile(self.device).__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self.profile is not None and state.global_step == self.step + 1:
            self.profile.__exit__(None, None, None)


def profile_record(profiled: StepProfile, a: argparse.Namespace, side: str) -> dict:
    """The profiled step's table written to ``--profile``, its launches in the record."""
    profiled.write(Path(a.profile) / f"{side}-{a.shape}.txt", f"{side}, {a.shape}: one step, {a.prompts} prompts x "
                   f"{a.group} x {a.new_tokens} new tokens, {a.precision}, gradient checkpointing {a.gradient_checkpointing}")
    launches = profiled.launches()
    return {"launches_per_step": launches, "launches_per_new_token": round(launches / a.new_tokens, 1)}


def measures(steps: list[dict], times: list[float], a: argparse.Namespace, model) -> dict:
    """The side's numbers over the measured steps (after the warm-up): medians of the per-step values."""
    kept = steps[a.warmup:]
    med = {k: statistics.median(s[k] for s in kept) for k in kept[0]}
    params = sum(p.numel() for p in model.parameters())
    # 6 flops per parameter and token (forward 2, backward 4); checkpointing's recomputed forward is not counted;
    # with LoRA 4 (the frozen weights get no gradient, only the inputs do), the adapters' own flops left out
    mfu = (4 if a.lora_rank else 6) * params * med["forwarded_tokens"] / med["learner_s"] / (a.peak_tflops * 1e12)
    floor = decode_floor_s(model.config, med["rows"], med["prompt_tokens"] / med["rows"], a.new_tokens, a.copy_gb_s)
    return {"params": params, **spread(times, a.warmup), "steps_per_s": round(1 / statistics.median(times[a.warmup:]), 4),
            "rollout_s": round(med["rollout_s"], 3), "learner_s": round(med["learner_s"], 3),
            "rollout_tok_s": round(med["completion_tokens"] / med["rollout_s"], 1),
            "learner_tok_s": round((med["prompt_tokens"] + med["completion_tokens"]) / med["learner_s"], 1),
            "learner_mfu": round(mfu, 4), "rows_per_step": int(med["rows"]), "reward_mean": round(med["reward"], 4),
            # the rollout's time holds its prefill too: the fraction is a lower bound of the decode's own
            "copy_gb_s": round(a.copy_gb_s, 1), "decode_floor_s": round(floor, 4),
            "rollout_vs_floor": round(floor / med["rollout_s"], 4),
            # over every step, the warm-up too: equal to --new-tokens when no completion ended early
            "mean_completion_tokens": sum(s["completion_tokens"] for s in steps) / sum(s["rows"] for s in steps)}


def setting(rec: dict) -> str:
    return (f"{rec['shape']} {rec['precision']} gc={rec['gradient_checkpointing']} "
            f"{rec['prompts']}x{rec['group']}x{rec['new_tokens']}" + (f" lora={rec['lora_rank']}" if rec.get("lora_rank")
                                                                      else ""))


def summary(path: str) -> None:
    """Medians over the calls of each side and setting; grpoplus against TRL on each setting, with the targets."""
    groups: dict[tuple[str, str], list[dict]] = {}
    with open(path) as handle:
        for line in handle:
            if line.startswith('{"side"'):  # the records (TRL prints a dict of its own too)
                rec = json.loads(line)
                side = " ".join(filter(None, (rec["side"], rec.get("overrides"))))
                groups.setdefault((setting(rec), side), []).append(rec)
    table = {key: {k: round(statistics.median(r[k] for r in recs), 4) for k in MEASURES if k in recs[0]}
             | {"calls": len(recs)} for key, recs in groups.items()}
    for (where, side), row in table.items():
        print(json.dumps({"setting": where, "side": side, **row}))
    for (where, side), ours in table.items():
        trl = table.get((where, "trl"))
        if not side.startswith("grpoplus") or trl is None:
            continue
        ratios = {"steps_per_s_ratio": round(ours["steps_per_s"] / trl["steps_per_s"], 2),
                  "peak_mem_ratio": round(ours["peak_mem_mb"] / trl["peak_mem_mb"], 2),
                  "learner_mfu": ours["learner_mfu"], "trl_learner_mfu": trl["learner_mfu"]}
        print(json.dumps({"setting": where, "compare": f"{side} / trl", **ratios}))
        speed = TARGETS["lora_steps_per_s_ratio" if " lora=" in where else "steps_per_s_ratio"]
        checks = [(f"steps/s >= {speed:g}x TRL", ratios["steps_per_s_ratio"] >= speed),
                  ("peak memory <= TRL", ratios["peak_mem_ratio"] <= TARGETS["peak_mem_ratio"])]
        if where.startswith(TARGETS["mfu_shape"] + " "):
            checks += [(f"learner MFU >= {TARGETS['learner_mfu']:.0%}", ours["learner_mfu"] >= TARGETS["learner_mfu"]),
                       (f"rollout >= {TARGETS['rollout_vs_floor']:.0%} of the decode's floor",
                        ours["rollout_vs_floor"] >= TARGETS["rollout_vs_floor"])]
        for name, ok in checks:
            print(f"{'PASS' if ok else 'FAIL'}  {where}  {side}: {name}")


def calls_table(figures: dict) -> str:
    """A results page's table from the GPU check's record (``benchmarks/gpu_check.py`` stores one): every call of
    each side, in the order they ran, with its steps/s against the TRL call of the same setting in its pair (the
    latest TRL call before it)."""
    calls = [c for c in figures["calls"] if "side" in c]
    trl = {setting(c): c for c in reversed(calls) if c["side"] == "trl"}  # before any: the setting's first TRL call
    lines = ["| shape | side | micro-batch | s/step (median) | vs TRL | rollout s | learner s | learner MFU | "
             "rollout / decode floor | launches per new token | peak memory |", "|---|---|---:|---:|---:|---:|---:|"
             "---:|---:|---:|---:|"]
    for c in calls:
        if c["side"] == "trl":
            trl[setting(c)] = c  # each call against the TRL call of its pair: the latest one before it
        peer = trl.get(setting(c))
        ratio = f"{c['steps_per_s'] / peer['steps_per_s']:.2f}x" if peer else ""
        launches = c.get("launches_per_new_token")
        micro = c["micro_batch"] or f"auto ({c.get('micro_batch_tokens')} tokens)"  # 0: sized from memory
        shape = c["shape"] + (f" LoRA {c['lora_rank']}" if c.get("lora_rank") else "")
        lines.append(f"| {shape} | {' '.join(filter(None, (c['side'], c.get('overrides'))))} | {micro} | "
                     f"{c['median_s_per_step']:.2f} | {ratio} | {c['rollout_s']:.2f} | {c['learner_s']:.2f} | "
                     f"{c['learner_mfu']:.2f} | {c['rollout_vs_floor']:.2f} | {'' if launches is None else launches} | "
                     f"{c['peak_mem_mb'] / 1024:.1f} GB |")
    return "\n".join(lines)


VIEWS = {"table": calls_table}
"""What a page renders from a record (``benchmarks/render.py``)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", choices=["save", "trl", "grpoplus", "summary"])
    parser.add_argument("path", nargs="?", help="summary: the JSONL of the calls")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--model", help="the dir save writes and both sides load (default /tmp/gpu_vs_trl/SHAPE)")
    parser.add_argument("--tokenizer", help="save: a Hugging Face tokenizer dir (SmolLM2-135M-Instruct's)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="one GPU, or the CPU rehearsal")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8, help="completions per prompt")
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens of every completion")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="first steps left out of the medians")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--gradient-checkpointing", choices=["on", "off"], default="on")
    parser.add_argument("--micro-batch", type=int, default=0,
                        help="grpoplus learner.micro_batch_size (0: 64 with checkpointing, 16 without)")
    parser.add_argument("--profile", help="a folder: one more step under torch.profiler, its table written there")
    parser.add_argument("--lora-rank", type=int, default=0,
                        help="LoRA adapters of this rank on both sides (peft; 0: full fine-tuning)")
    parser.add_argument("--trl-micro-batch", type=int, default=0,
                        help="TRL per_device_train_batch_size, gradients accumulated over the batch (0: all rows)")
    a, overrides = parser.parse_known_args()
    if a.which == "summary":
        return summary(a.path)
    if overrides and a.which != "grpoplus":
        parser.error(f"unrecognized arguments: {' '.join(overrides)} (key=value overrides go to grpoplus only)")
    if a.which != "save" and a.steps <= a.warmup:
        parser.error(f"--steps ({a.steps}) must exceed --warmup ({a.warmup})")
    a.model = a.model or f"/tmp/gpu_vs_trl/{a.shape}"
    started = time.perf_counter()
    if a.which == "save":
        if not a.tokenizer:
            parser.error("save needs --tokenizer DIR")
        record = save(a.shape, a.tokenizer, a.model, a.device, a.seed)
        return print(json.dumps({**record, "wall_s": round(time.perf_counter() - started, 1)}), flush=True)
    a.peak_tflops = matmul_tflops(a.device, torch.bfloat16 if a.precision == "bf16" else torch.float32)
    a.copy_gb_s = copy_gb_s(a.device)
    record = run_trl(a) if a.which == "trl" else run_grpoplus(a, overrides)
    print(json.dumps({**record, "shape": a.shape, "device": device_name(a.device), "precision": a.precision,
                      "gradient_checkpointing": a.gradient_checkpointing, "lora_rank": a.lora_rank,
                      "prompts": a.prompts, "group": a.group,
                      "new_tokens": a.new_tokens, "peak_tflops": round(a.peak_tflops, 3),
                      "peak_mem_mb": round(peak_memory_mb(a.device), 1), **reserved_mb(a.device), "torch": torch.__version__,
                      "transformers": __import__("transformers").__version__,
                      "wall_s": round(time.perf_counter() - started, 1)}), flush=True)


if __name__ == "__main__":
    main()
