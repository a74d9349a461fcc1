"""A task made from a local data set (JSONL / JSON / Parquet / saved `datasets` dir).

Prompts come from ``prompt_field`` (through the model's chat template when it has one),
reference answers from ``answer_field`` (GSM8K / MATH extraction per ``answer_format``),
and correctness is checked by the math verifier. Without ``eval_data`` a deterministic
10% (at most ``eval_size``) of the rows is held out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grpoplus.tasks.base import Example


@dataclass
class DatasetTask:
    name: str
    train: list
    test: list

    def split(self, name: str) -> list:
        if name not in ("train", "test"):
            raise ValueError(f"unknown split {name!r}; choose train or test")
        return self.train if name == "train" else self.test

    def reward(self, prompts, completions, answer, **fields) -> list[float]:
        from grpoplus.rewards import math_reward

        return [math_reward(c, a) for c, a in zip(completions, answer)]


def _examples(path: str, d, tokenizer) -> list:
    from grpoplus.data import apply_chat_template, load_records

    loaded = load_records(path, prompt_field=d.prompt_field, answer_field=d.answer_field,
                          answer_format=d.answer_format, on_bad_row=d.on_bad_row)
    if loaded.skipped:
        shown = "; ".join(f"line {line}: {why}" for line, why in loaded.skipped[:5])
        print(f"{path}: skipped {len(loaded.skipped)} malformed rows ({shown})")
    if not loaded.records:
        raise ValueError(f"{path}: no usable rows (fields {d.prompt_field!r} / {d.answer_field!r})")
    return [Example(apply_chat_template(tokenizer, r["prompt"]) if tokenizer is not None else r["prompt"],
                    r["answer"], r.get("fields", {})) for r in loaded.records]


def dataset_task(d, tokenizer, seed: int) -> DatasetTask:
    """Build from a :class:`grpoplus.config.DataConfig` (``data``, fields, ``eval_data``)."""
    rows = _examples(d.data, d, tokenizer)
    if d.eval_data:
        return DatasetTask(d.task, rows, _examples(d.eval_data, d, tokenizer))
    if len(rows) < 2:
        raise ValueError(f"{d.data}: at least 2 rows are needed to hold some out (or give eval_data)")
    order = torch.randperm(len(rows), generator=torch.Generator().manual_seed(seed)).tolist()
    n_test = max(1, min(d.eval_size, len(rows) // 10))
    return DatasetTask(d.task, [rows[i] for i in order[n_test:]], [rows[i] for i in order[:n_test]])
