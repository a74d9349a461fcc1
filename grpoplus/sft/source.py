"""Where a supervised stage's demonstrations come from: a file of chat rows, a built-in task's own worked answers,
or a teacher's samples (off-policy distillation); each made into :class:`~grpoplus.sft.demos.Demo` rows once, before
the first step, and split into training and held-out demonstrations."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpoplus.sft.demos import Demo, DemoError, checked_messages, render, row_tools, turns_demo


@dataclass
class DemoSet:
    """The stage's demonstrations: ``train`` and ``held_out`` rows, the rows skipped with their reason, and how
    many were cut at ``sft.max_length``."""

    train: list[Demo]
    held_out: list[Demo]
    skipped: list[tuple[int, str]] = field(default_factory=list)
    cut: int = 0
    source_correct: float | None = None  # sft.demo_model: the share of its samples the task's verifier accepted


def file_demos(path: str | Path, tokenizer, messages_field: str, max_length: int, on_bad_row: str
               ) -> tuple[list[Demo], list[tuple[int, str]]]:
    """Every usable row of a demonstrations file, rendered; a bad row is skipped with its reason (``on_bad_row=skip``)
    or stops the load in one line naming it (``error``)."""
    from grpoplus.data.loaders import read_rows

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"sft.demos: demonstrations file {str(path)!r} does not exist")
    demos, skipped = [], []
    for line, row in read_rows(path):
        where = f"{path}: line {line}"
        try:
            if isinstance(row, Exception):
                raise DemoError(f"{where}: {row}")
            demos.append(render(tokenizer, checked_messages(row, where, messages_field), row_tools(row, where),
                                max_length))
        except DemoError as bad:
            if on_bad_row == "error":
                raise
            skipped.append((line, str(bad)))
    if not demos:
        reasons = "; ".join(reason for _, reason in skipped[:3])
        raise ValueError(f"sft.demos: {path} holds no usable demonstration ({len(skipped)} rows skipped: {reasons})")
    return demos, skipped


def rows_demos(rows: list[dict], tokenizer, max_length: int) -> list[Demo]:
    """Demonstrations from rows the project writes itself (:mod:`grpoplus.sft.builtin`)."""
    return [render(tokenizer, checked_messages(row, f"row {i}"), row_tools(row, f"row {i}"), max_length)
            for i, row in enumerate(rows, start=1)]


def task_demos(task, examples: list, tokenizer, direct_frac: float, seed: int, max_length: int) -> list[Demo]:
    """A built-in task's demonstrations: each training problem's prompt (as the engine is given it) and the task's
    worked answer (``sft_target``; with probability ``direct_frac`` its final ``#answer`` alone), or a multi-turn
    task's whole games (``sft_episode``)."""
    if not hasattr(task, "sft_target") and not hasattr(task, "sft_episode"):
        raise ValueError(f"task {getattr(task, 'name', task)!r} has no worked answers to learn from: give "
                         "demonstrations (sft.demos FILE) or a model that writes them (sft.demo_model)")
    rng = random.Random(seed)
    demos = []
    for example in examples:
        if hasattr(task, "sft_episode"):
            turns = task.sft_episode(example, rng)
        else:
            worked = task.sft_target(example)
            turns = [("#" + worked.rpartition("#")[2] if rng.random() < direct_frac else worked, None)]
        ids, vision = prompt_ids(tokenizer, example)
        demos.append(dataclasses.replace(turns_demo(tokenizer, ids, turns, max_length), vision=vision))
    return demos


def prompt_ids(tokenizer, example) -> tuple[list[int], object]:
    """An example's prompt ids as the engine is given them, and its images' processor outputs (None without any):
    a vision-language policy's prompt through its processor, which expands each image's placeholder."""
    images = getattr(example, "images", ())
    if not images:
        return tokenizer(example.prompt)["input_ids"], None
    from grpoplus.data.images import load_image
    from grpoplus.models.vision import encode_prompts, processor_of

    processor = processor_of(tokenizer)
    if processor is None:
        raise ValueError(f"a prompt with images, but the model has no image processor (tokenizer "
                         f"{type(tokenizer).__name__}): a vision-language model is needed")
    ids, mask, vision = encode_prompts(processor, [example.prompt], [[load_image(s) for s in images]], 0)
    return ids[0][mask[0].bool()].tolist(), vision[0]


def split_held_out(demos: list[Demo], held_out: int, seed: int) -> tuple[list[Demo], list[Demo]]:
    """(train, held_out): ``held_out`` demonstrations drawn by ``seed`` (at most a fifth of them), the rest in their
    order."""
    n = min(held_out, len(demos) // 5)
    if n <= 0:
        return list(demos), []
    picked = set(torch.randperm(len(demos), generator=torch.Generator().manual_seed(seed)).tolist()[:n])
    return [d for i, d in enumerate(demos) if i not in picked], [d for i, d in enumerate(demos) if i in picked]


def cut_count(demos: list[Demo], max_length: int) -> int:
    """How many demonstrations reach ``max_length`` tokens (cut there)."""
    return sum(d.tokens >= max_length for d in demos) if max_length else 0
