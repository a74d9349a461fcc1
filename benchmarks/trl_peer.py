"""The peer's side of the side-by-side benchmark: TRL's GRPOTrainer on the same CPU task.

A ~2.4M-parameter Llama with the grpoplus character tokenizer, arithmetic prompts, 4
prompts x 8 generations = 32 completions of (at most) 8 tokens per optimizer step, fp32 on
CPU. Prints one JSON line: the median seconds per step after the warm-up steps.

    pip install trl          # does not touch torch (checked with --dry-run)
    OMP_NUM_THREADS=1 python benchmarks/trl_peer.py --steps 20 --warmup 3

The grpoplus side uses :func:`peer_model` for the same model (``from benchmarks.trl_peer
import peer_model`` or copy the config below).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing may be downloaded
os.environ.setdefault("WANDB_DISABLED", "true")

import torch  # noqa: E402
from transformers import LlamaForCausalLM, TrainerCallback  # noqa: E402

from grpoplus.models.tiny import tiny_model  # noqa: E402
from grpoplus.models.tokenizer import char_tokenizer  # noqa: E402
from grpoplus.tasks import get_task  # noqa: E402
from grpoplus.tasks.arithmetic import arithmetic_reward  # noqa: E402

PEER_MODEL = dict(hidden_size=192, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=4)
"""~2.4M parameters with the 98-token character vocabulary (tied embeddings)."""


def peer_model(tokenizer, seed: int = 0) -> LlamaForCausalLM:
    """The benchmark's policy: a randomly initialised fp32 Llama of ``PEER_MODEL`` size."""
    return tiny_model(tokenizer, seed=seed, **PEER_MODEL)


def peer_prompts(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """``n`` prompts and answers of the built-in arithmetic task (default difficulty)."""
    examples = list(get_task("arithmetic", seed=seed).split("train"))[:n]
    return [e.prompt for e in examples], [e.answer for e in examples]


class StepTimer(TrainerCallback):
    """Wall-clock seconds of every optimizer step (generation, scoring and update included)."""

    def __init__(self):
        self.times: list[float] = []
        self._start = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self._start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps to run")
    parser.add_argument("--warmup", type=int, default=3, help="first steps left out of the median")
    parser.add_argument("--prompts-per-step", type=int, default=4)
    parser.add_argument("--generations", type=int, default=8, help="completions per prompt (G)")
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    if args.steps <= args.warmup:
        raise SystemExit(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")

    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    tok = char_tokenizer()
    model = peer_model(tok)
    completions = args.prompts_per_step * args.generations
    prompts, answers = peer_prompts(args.steps * args.prompts_per_step)
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out_dir:
        config = GRPOConfig(
            output_dir=out_dir, use_cpu=True, max_steps=args.steps, per_device_train_batch_size=completions,
            num_generations=args.generations, max_completion_length=args.max_new_tokens, temperature=1.0,
            learning_rate=1e-4, beta=0.0, logging_steps=10**6, save_strategy="no", report_to="none",
            dataloader_num_workers=0, seed=0, bf16=False, fp16=False, disable_tqdm=True,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=arithmetic_reward, args=config,
                              train_dataset=Dataset.from_dict({"prompt": prompts, "answer": answers}),
                              processing_class=tok, callbacks=[timer])
        trainer.train()
    measured = timer.times[args.warmup:]
    print(json.dumps({
        "peer": "trl.GRPOTrainer", "trl_version": __import__("trl").__version__,
        "params": sum(p.numel() for p in model.parameters()), "completions_per_step": completions,
        "max_new_tokens": args.max_new_tokens, "threads": args.threads, "steps_measured": len(measured),
        "median_s_per_step": round(statistics.median(measured), 4),
    }))


if __name__ == "__main__":
    main()
