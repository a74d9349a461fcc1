"""``grpoplus sft`` against the built-in warm start's own loop, side by side on the same recipe.

Both start from the built-in tiny Llama as initialised by the seed (``--model tiny-untrained``) and train on the
arithmetic task's worked answers (half of them the final answer alone: the warm start's mixture) with its recipe:
AdamW (betas 0.9 / 0.98, weight decay 0.01), lr 3e-3 after a 50-step linear warm-up, 64 demonstrations a step,
gradients clipped at 1.0. They differ in the data order (the warm start draws with ``random.Random(seed)``, the stage
with the run's epoch-wise shuffle). Prints the training loss (mean over windows of 50 steps) of each, side by side,
and the held-out greedy accuracy each reaches::

    python benchmarks/sft_vs_warmstart.py --steps 700 --seeds 0 1
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def warmstart_losses(seed: int, steps: int) -> tuple[list[float], float]:
    """The warm start's own loop (grpoplus.sft.warmstart.train_sft) and the held-out accuracy it reaches."""
    import torch

    from grpoplus.loop.evaluation import evaluate
    from grpoplus.models.tiny import tiny_model
    from grpoplus.models.tokenizer import char_tokenizer
    from grpoplus.rollout.hf import HFEngine
    from grpoplus.sft.warmstart import sft_targets, train_sft
    from grpoplus.tasks import get_task

    task = get_task("arithmetic", seed=seed)
    train = task.split("train")
    tokenizer = char_tokenizer()
    tokenizer.padding_side = "left"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = tiny_model(tokenizer, size="small", seed=seed)
        losses = train_sft(model, tokenizer, [e.prompt for e in train], sft_targets(task, train, 0.5, seed),
                           steps=steps, batch_size=64, lr=3e-3, seed=seed)
    model.config.pad_token_id = tokenizer.pad_token_id
    held_out = get_task("arithmetic", seed=0).split("test")[:200]
    accuracy = evaluate(HFEngine(model, tokenizer), task, held_out, max_new_tokens=48, temperature=1.0, top_p=1.0,
                        samples=1, seed=0)["eval/accuracy"]
    return losses, accuracy


def stage_losses(seed: int, steps: int) -> tuple[list[float], float]:
    """``grpoplus sft --model tiny-untrained`` with the warm start's recipe."""
    from grpoplus.entry.api import SFTTrainer

    with tempfile.TemporaryDirectory() as out:
        result = SFTTrainer("tiny-untrained", out=out, seed=seed, max_steps=steps, demos_per_step=64, lr=3e-3,
                            adam_beta2=0.98, weight_decay=0.01, warmup_steps=50, lr_schedule="constant",
                            eval_every=0, eval_demos=0, eval_samples=1, progress=False, loggers=[]).train()
        records = result.metrics
    losses = [r["loss/nll"] for r in records if "loss/nll" in r]
    return losses, records[-1]["eval/accuracy"]


def windows(losses: list[float], width: int = 50) -> list[float]:
    return [sum(losses[i:i + width]) / len(losses[i:i + width]) for i in range(0, len(losses), width)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    a = parser.parse_args(argv)
    for seed in a.seeds:
        ws, ws_acc = warmstart_losses(seed, a.steps)
        st, st_acc = stage_losses(seed, a.steps)
        print(json.dumps({"seed": seed, "steps": a.steps, "warmstart_loss_windows": [round(x, 3) for x in windows(ws)],
                          "sft_loss_windows": [round(x, 3) for x in windows(st)],
                          "warmstart_accuracy": ws_acc, "sft_accuracy": st_acc}), flush=True)


if __name__ == "__main__":
    main()
