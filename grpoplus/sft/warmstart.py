"""Warm start: a short supervised run of the tiny model on a built-in task, cached on disk.

RL needs a policy that already solves some problems (otherwise every reward is 0 and
every GRPO advantage is 0) but not most (otherwise there is nothing left to learn). A
deliberately short supervised run on ``prompt -> sft_target(example)`` of the train split
gives exactly that. The result is an ordinary Hugging Face model dir (model +
tokenizer, safetensors) under::

    ${GRPOPLUS_CACHE:-~/.cache/grpoplus}/warmstart/<task>-d<difficulty>-<size>-<hash of the recipe>/

written to a temporary dir first and renamed into place, so a killed build never leaves
a cache that looks complete. Same recipe and seed -> same weights. Rebuild with::

    python -m grpoplus.sft.warmstart --task arithmetic
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from grpoplus.envs.render import observation_ids
from grpoplus.models.cpu_matmul import route
from grpoplus.models.load import (
    TINY_MOE,
    TINY_TEACHER,
    TINY_UNTRAINED,
    TINY_VISION,
    TINY_VISION_FAMILY,
    builtin_family,
    load_hf_dir,
    prepared,
)
from grpoplus.models.moe import balance_loss_while_training
from grpoplus.models.qlora import FourBit
from grpoplus.models.tiny import tiny_model
from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.tasks import TASKS, get_task, without_prompts

RECIPE_VERSION = 3
"""Bump when the warm-start code changes what it builds: old caches are then not reused."""

REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "recipe.json")
"""A cache dir is complete only when all of these exist (``recipe.json`` is written last)."""

DEFAULT_STEPS = 700
DEFAULT_BATCH_SIZE = 64
DEFAULT_LR = 3e-3
DEFAULT_DIRECT_FRAC = 0.5
"""Share of SFT targets that state the answer directly (``#10``) instead of working it out."""

def teacher_recipe(task: str) -> dict:
    """The built-in teacher's warm start (``tiny-teacher``) on ``task``: the medium Llama, three times the default
    policy's steps, every target worked out. Seed 0 whatever the run's seed: a teacher is one given model (it
    answers or scores training prompts only, so it never shows a student a held-out problem's answer)."""
    steps = getattr(TASKS.get(task), "sft_steps", DEFAULT_STEPS)
    return dict(size="medium", steps=3 * steps, direct_frac=0.0, seed=0)


def cache_root() -> Path:
    """``$GRPOPLUS_CACHE`` or ``~/.cache/grpoplus``."""
    return Path(os.environ.get("GRPOPLUS_CACHE") or Path.home() / ".cache" / "grpoplus")


def default_difficulty(task: str) -> int:
    """The ``difficulty`` default of the registered task factory."""
    parameter = inspect.signature(TASKS.get(task)).parameters.get("difficulty")
    if parameter is None or parameter.default is inspect.Parameter.empty:
        raise ValueError(f"task {task!r} has no default difficulty; the warm start needs a built-in task")
    return parameter.default


def warmstart_recipe(
    task: str,
    difficulty: int | None = None,
    *,
    size: str = "small",
    seed: int = 0,
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float = DEFAULT_LR,
    direct_frac: float = DEFAULT_DIRECT_FRAC,
    eval_seed: int | None = None,
) -> dict:
    """Everything that determines the warm-started weights (hashed into the cache dir name).

    ``steps`` / ``batch_size`` (None): the task factory's ``sft_steps`` / ``sft_batch_size`` when it names them (a
    task of long responses takes fewer, smaller steps), else :data:`DEFAULT_STEPS` / :data:`DEFAULT_BATCH_SIZE`.
    ``eval_seed``: the seed of the held-out split the run evaluates on, when it is not ``seed``;
    its prompts are then left out of the supervised data (recorded only then, so the recipes,
    and the caches, of runs that evaluate on their own seed's split are unchanged).
    """
    difficulty = default_difficulty(task) if difficulty is None else difficulty
    factory = TASKS.get(task)
    steps = getattr(factory, "sft_steps", DEFAULT_STEPS) if steps is None else steps
    batch_size = getattr(factory, "sft_batch_size", DEFAULT_BATCH_SIZE) if batch_size is None else batch_size
    recipe = dict(
        version=RECIPE_VERSION, task=task, difficulty=difficulty, size=size,
        seed=seed, steps=steps, batch_size=batch_size, lr=lr, direct_frac=direct_frac,
    )
    if eval_seed is not None and eval_seed != seed:
        recipe["eval_seed"] = eval_seed
    games = getattr(factory, "sft_version", None)  # a multi-turn task's own version of its warm-start games
    if games is not None:
        recipe["games"] = games
    return recipe


def warmstart_dir(recipe: dict) -> Path:
    """The cache dir of ``recipe``: ``<root>/warmstart/<task>-d<difficulty>-<size>-<hash>``."""
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "warmstart" / f"{recipe['task']}-d{recipe['difficulty']}-{recipe['size']}-{digest}"


def is_complete(path: Path) -> bool:
    """True when ``path`` holds every file of a finished warm start."""
    return all((path / name).is_file() for name in REQUIRED_FILES)


def encode_sft(tokenizer, prompts: list[str], targets: list[str]) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask``/``labels`` [B, T] for ``<bos> prompt target <eos>``.

    Labels are -100 on the prompt and padding: the loss is on the response (and EOS) only.
    """
    rows, label_rows = [], []
    for prompt, target in zip(prompts, targets):
        prompt_ids = tokenizer(prompt)["input_ids"]  # <bos> + prompt, as at generation time
        ids, labels = _target_ids(tokenizer, target)
        rows.append(prompt_ids + ids)
        label_rows.append([-100] * len(prompt_ids) + labels)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    return dict(
        input_ids=torch.tensor([r + [pad] * (width - len(r)) for r in rows]),  # [B, T]
        attention_mask=torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),  # [B, T]
        labels=torch.tensor([r + [-100] * (width - len(r)) for r in label_rows]),  # [B, T]
    )


def _target_ids(tokenizer, target: str | list) -> tuple[list[int], list[int]]:
    """(ids, labels) of a response: one turn ending in ``<eos>``, or a multi-turn game's turns, each ending in
    ``<eos>`` and followed by its observation in the environment markup (no loss on the observation)."""
    turns = [(target, None)] if isinstance(target, str) else target
    ids, labels = [], []
    for text, obs in turns:
        turn = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seen = observation_ids(tokenizer, obs)
        ids += turn + seen
        labels += turn + [-100] * len(seen)
    return ids, labels


def train_sft(model, tokenizer, prompts: list[str], targets: list[str], *, steps: int, batch_size: int, lr: float,
              seed: int, report: Callable[[int, int, float], None] | None = None) -> list[float]:
    """``steps`` AdamW steps of next-token cross-entropy on the responses; returns the losses.

    Linear warm-up over ``min(50, steps // 5)`` steps, then constant: the run is meant to stop
    part-way (a partly trained policy), so accuracy grows with ``steps`` with no decay tail.
    Batches are drawn by a ``random.Random(seed)`` shuffle, so the run is deterministic.
    ``report(step, steps, loss)`` is called after steps 10, 100, 200, ... and the last.
    """
    rng = random.Random(seed)
    order: list[int] = []
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, min(50, steps // 5))
    losses = []
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup)
        if len(order) < batch_size:
            order += rng.sample(range(len(prompts)), len(prompts))
        batch_ids, order = order[:batch_size], order[batch_size:]
        batch = encode_sft(tokenizer, [prompts[i] for i in batch_ids], [targets[i] for i in batch_ids])
        loss = model(**batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if report is not None and (step + 1 == 10 or (step + 1) % 100 == 0 or step == steps - 1):
            report(step + 1, steps, losses[-1])
    model.eval()
    return losses


def sft_targets(task, examples, direct_frac: float, seed: int) -> list:
    """The SFT response of each example: the worked target, or with probability ``direct_frac``
    only its final ``#answer`` part (a target without ``#``, a function call, has no shorter form).

    The mixture gives the warm-started policy two habits: answering at once (short, usually
    wrong on long problems) and working step by step (longer, usually right). Greedy decoding
    follows the more frequent habit, so pass@1 starts low while pass@k is high; RL then has a
    clear signal to learn from, and response length grows as it learns to work things out.
    """
    rng = random.Random(seed)
    if hasattr(task, "sft_episode"):  # a multi-turn task: whole games, its own mixture of habits
        return [task.sft_episode(example, rng) for example in examples]
    targets = []
    for example in examples:
        worked = task.sft_target(example)
        direct = rng.random() < direct_frac  # drawn for every example: the other tasks' targets stay as they were
        targets.append("#" + worked.rpartition("#")[2] if direct and "#" in worked else worked)
    return targets


def build_into(path: Path, recipe: dict) -> None:
    """Run the warm start of ``recipe`` and save model, tokenizer and ``recipe.json`` into ``path``."""
    task = get_task(recipe["task"], difficulty=recipe["difficulty"], seed=recipe["seed"])
    train = task.split("train")
    if "eval_seed" in recipe:  # never train on a problem of the run's held-out split
        held_out = get_task(recipe["task"], difficulty=recipe["difficulty"], seed=recipe["eval_seed"]).split("test")
        train = without_prompts(train, held_out)
    tokenizer = char_tokenizer()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe["seed"])
        model = route(tiny_model(tokenizer, size=recipe["size"], seed=recipe["seed"]))  # the run's learner.cpu_matmul
        started = time.perf_counter()
        with balance_loss_while_training(model):
            losses = train_sft(
                model, tokenizer, [e.prompt for e in train],
                sft_targets(task, train, recipe["direct_frac"], recipe["seed"]),
                steps=recipe["steps"], batch_size=recipe["batch_size"], lr=recipe["lr"], seed=recipe["seed"],
                report=_progress_reporter(started),
            )
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    summary = dict(recipe, final_loss=losses[-1] if losses else None, seconds=round(time.perf_counter() - started, 1))
    (path / "recipe.json").write_text(json.dumps(summary, indent=2) + "\n")  # last: marks the dir complete


def _say(text: str) -> None:
    print(f"warm start: {text}", file=sys.stderr, flush=True)


def _progress_reporter(started: float) -> Callable[[int, int, float], None]:
    """``report`` for :func:`train_sft`: a stderr line with the loss, the time so far and what is left."""
    def report(step: int, steps: int, loss: float) -> None:
        spent = time.perf_counter() - started
        _say(f"step {step}/{steps} loss {loss:.2f} ({spent:.0f} s, about {spent / step * (steps - step):.0f} s left)")
    return report


def build_warmstart(
    task: str = "arithmetic",
    difficulty: int | None = None,
    *,
    size: str = "small",
    seed: int = 0,
    steps: int | None = None,
    batch_size: int | None = None,
    lr: float = DEFAULT_LR,
    direct_frac: float = DEFAULT_DIRECT_FRAC,
    eval_seed: int | None = None,
    rebuild: bool = False,
) -> Path:
    """The cached warm-start dir of this recipe, built first if missing, incomplete or ``rebuild``.

    Safe against a killed build (temporary dir + atomic rename) and against two processes building at once: a lock
    file beside the dir makes the second wait for the first's result (a lock the system releases when its holder
    dies), so the same warm start is never built twice on one machine.
    """
    from filelock import FileLock, Timeout

    recipe = warmstart_recipe(task, difficulty, size=size, seed=seed, steps=steps, batch_size=batch_size, lr=lr,
                              direct_frac=direct_frac, eval_seed=eval_seed)
    final = warmstart_dir(recipe)
    if is_complete(final) and not rebuild:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(final.parent / f".{final.name}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        _say(f"waiting for another process building {final.name}")
        lock.acquire()
    try:
        if is_complete(final) and not rebuild:  # built by the process this one waited for
            return final
        _build(final, recipe)
    finally:
        lock.release()
    return final


def _build(final: Path, recipe: dict) -> None:
    _say(f"building {final.name} ({recipe['steps']} supervised steps of the tiny model; once per recipe, then cached "
         f"in {final.parent})")
    started = time.perf_counter()
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{final.name}-", dir=final.parent))
    try:
        build_into(staging, recipe)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    _say(f"done in {time.perf_counter() - started:.0f} s")


def check_warm_start(model: str | None, task: str | None) -> None:
    """Refuse a built-in tiny model (but ``tiny-untrained``) without a built-in task to warm-start it on (a data
    set's run): the one statement of this refusal, for :func:`load_builtin` and the config rules ``models`` and
    ``teacher`` (learner.model, learner.teacher, sft.demo_model)."""
    if model not in (TINY_UNTRAINED, TINY_VISION) and task is None:
        name = "the built-in tiny model" if model is None else f"the built-in tiny model {model}"
        raise ValueError(f"{name} is warm-started on a built-in task, and a data set's run (data.data) names none: "
                         "name a model directory or file instead (--model PATH)")


def load_builtin(model: str | None, task: str | None, difficulty: int | None = None, *, seed: int = 0,
                 eval_seed: int | None = None, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                 quantize: FourBit | None = None):
    """``(model, tokenizer)`` of a built-in tiny model (``None``: the Llama, ``"tiny-moe"``: the mixture of experts)
    warm-started on ``task`` (built on first use, then cached). ``seed`` seeds its warm start (initial weights and
    supervised data); ``eval_seed`` (default ``seed``) names the held-out split whose prompts it never trains on;
    ``quantize``: its 4-bit base (:mod:`grpoplus.models.qlora`), made from the warm start as loaded."""
    if model == TINY_UNTRAINED:  # as initialised by ``seed``: what a supervised stage starts from
        tokenizer = char_tokenizer()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return prepared(tiny_model(tokenizer, size="small", seed=seed), tokenizer, device, quantize)
    if model == TINY_VISION:  # as initialised by ``seed``, with its processor
        from grpoplus.models.tiny_vision import tiny_vision_model
        from grpoplus.models.vision import with_processor

        policy, processor = tiny_vision_model(TINY_VISION_FAMILY, seed=seed)
        return prepared(policy, with_processor(processor.tokenizer, processor), device, quantize)
    check_warm_start(model, task)
    if model == TINY_TEACHER:
        path = build_warmstart(task, difficulty, **teacher_recipe(task))
        return prepared(*load_hf_dir(path, dtype), device, quantize)
    size = "moe" if model == TINY_MOE else builtin_family(model) or "small"
    path = build_warmstart(task, difficulty, size=size, seed=seed, eval_seed=eval_seed)
    return prepared(*load_hf_dir(path, dtype), device, quantize)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build (or rebuild) the cached warm-started tiny model of a task.")
    parser.add_argument("--task", default="arithmetic", help="built-in task name")
    parser.add_argument("--difficulty", type=int, default=None, help="task difficulty (default: the task's)")
    parser.add_argument("--size", default="small", help="tiny model size: nano, small, or moe / moe-nano (mixture of experts)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-seed", type=int, default=None,
                        help="seed of the held-out split to keep out of the supervised data (default: --seed)")
    parser.add_argument("--steps", type=int, default=None, help=f"supervised steps (default: the task's, else "
                                                                  f"{DEFAULT_STEPS})")
    parser.add_argument("--batch-size", type=int, default=None, help=f"(default: the task's, else {DEFAULT_BATCH_SIZE})")
    parser.add_argument("--lr", type=float, default=DEFAULT_LR)
    parser.add_argument("--direct-frac", type=float, default=DEFAULT_DIRECT_FRAC,
                        help="share of SFT targets that give the answer without working")
    parser.add_argument("--rebuild", action="store_true", help="rebuild even when a complete cache exists")
    args = parser.parse_args(argv)
    path = build_warmstart(
        args.task, args.difficulty, size=args.size, seed=args.seed, steps=args.steps,
        batch_size=args.batch_size, lr=args.lr, direct_frac=args.direct_frac, eval_seed=args.eval_seed,
        rebuild=args.rebuild,
    )
    print(path)


if __name__ == "__main__":
    main()
