"""A task made from a local data set (JSONL / JSON / Parquet / saved `datasets` dir).

Prompts come from ``prompt_field`` (through the model's chat template when it has one),
reference answers from ``answer_field`` (GSM8K / MATH extraction per ``answer_format``),
and correctness is checked by the math verifier. Without ``eval_data`` a deterministic
10% (at most ``eval_size``) of the rows is held out.

A function-calling data set (rows that carry their own ``tools``, :mod:`grpoplus.data.functions`) is checked by
the ``function_call`` reward instead, and each prompt is rendered with its row's tools (through a template that
takes ``tools``, else described in a system message with the call format stated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from grpoplus.tasks.base import Example


def math_verifier(prompts, completions, answer, **fields) -> list[float]:
    from grpoplus.rewards import math_reward

    return [math_reward(c, a) for c, a in zip(completions, answer)]


def function_call_verifier(prompts, completions, answer, **fields) -> list[float | None]:
    from grpoplus.rewards.function_call import function_call_reward

    return function_call_reward(prompts, completions, answer=answer, tools=fields.get("tools"),
                                parallel=fields.get("parallel"))


@dataclass
class DatasetTask:
    name: str
    train: list
    test: list
    verifier: Callable[..., list] = math_verifier

    def split(self, name: str) -> list:
        if name not in ("train", "test"):
            raise ValueError(f"unknown split {name!r}; choose train or test")
        return self.train if name == "train" else self.test

    def reward(self, prompts, completions, answer, **fields) -> list:
        return self.verifier(prompts, completions, answer, **fields)


@dataclass(frozen=True)
class DataRows:
    """A data set's records, read (and their rows checked) before any model loads; ``held_out``: those of
    ``eval_data``, None without it."""

    train: list[dict]
    held_out: list[dict] | None
    function_calls: bool = False
    bad_rows: int = 0  # rows skipped as malformed (data.on_bad_row=skip), in both files

    def metrics(self) -> dict[str, float]:
        """Step 0's record of the rows left out: none of them is trained or evaluated on."""
        return {"data/bad_rows": float(self.bad_rows)}


def read_rows(d) -> DataRows:
    """The records of ``d.data`` and ``d.eval_data``: ``d`` is a run's data plan (:class:`grpoplus.plan.data.DataPlan`)
    or a data section (:class:`grpoplus.config.DataConfig`), whose keys it names alike."""
    train, calls, bad = _records(d.data, d)
    held_out, _, bad_held_out = _records(d.eval_data, d) if d.eval_data else (None, False, 0)
    return DataRows(train, held_out, calls, bad + bad_held_out)


def _records(path: str, d) -> tuple[list[dict], bool, int]:
    from grpoplus.data import load_records

    loaded = load_records(path, prompt_field=d.prompt_field, answer_field=d.answer_field,
                          answer_format=d.answer_format, on_bad_row=d.on_bad_row)
    if loaded.skipped:
        shown = "; ".join(f"line {line}: {why}" for line, why in loaded.skipped[:5])
        print(f"{path}: skipped {len(loaded.skipped)} malformed rows ({shown})")
    if not loaded.records:
        raise ValueError(f"{path}: no usable rows (fields {d.prompt_field!r} / {d.answer_field!r})")
    return loaded.records, loaded.function_calls, len(loaded.skipped)


def _example(record: dict, tokenizer, path: str) -> Example:
    """A record as an example: its prompt through the chat template (``tokenizer`` None: as it is), a
    function-calling record's with its tools (described above the prompt without a template); its origin is the
    file's line."""
    from grpoplus.data import apply_chat_template
    from grpoplus.data.images import IMAGE_FIELD, image_messages
    from grpoplus.models.vision import processor_of

    fields, origin = record.get("fields", {}), f"{path} line {record.get('line', '?')}"
    if "tools" in fields:
        return Example(apply_chat_template(tokenizer, fields["messages"], tools=fields["tools"]), record["answer"],
                       fields, origin)
    images = fields.get(IMAGE_FIELD) or ()
    if images and tokenizer is None:  # rendered later (a multi-turn run's episodes), or as written (no template)
        return Example(record["prompt"], record["answer"], fields, origin, images=tuple(images))
    if images:  # shown before the text, one placeholder each (the model's chat template renders them)
        if processor_of(tokenizer) is None:
            raise ValueError(images_for_text_model(origin, len(images)))
        prompt = apply_chat_template(processor_of(tokenizer), image_messages(record["prompt"], len(images)))
        return Example(prompt, record["answer"], fields, origin, images=tuple(images))
    prompt = apply_chat_template(tokenizer, record["prompt"]) if tokenizer is not None else record["prompt"]
    return Example(prompt, record["answer"], fields, origin)


def images_for_text_model(origin: str, count: int, model: str | None = None) -> str:
    """The one line for a row with images given to a text policy."""
    named = f"the policy ({model})" if model else "the policy"
    return (f"{origin}: the row shows {count} image(s), and {named} is a text model (it comes with no image processor):"
            " use a vision-language model (an image-text-to-text model directory, or tiny-vlm), or rows without images")


def dataset_task(d, tokenizer, seed: int, rows: DataRows | None = None) -> DatasetTask:
    """Build from a data plan or section as :func:`read_rows` takes it (``data``, fields, ``eval_data``,
    ``eval_size``) and its ``rows`` (read now when not given)."""
    rows = rows or read_rows(d)
    verifier = function_call_verifier if rows.function_calls else math_verifier
    train = [_example(r, tokenizer, d.data) for r in rows.train]
    if rows.held_out is not None:
        return DatasetTask(d.task, train, [_example(r, tokenizer, d.eval_data) for r in rows.held_out], verifier)
    if len(train) < 2:
        raise ValueError(f"{d.data}: at least 2 rows are needed to hold some out (or give eval_data)")
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
    n_test = max(1, min(d.eval_size, len(train) // 10))
    return DatasetTask(d.task, [train[i] for i in order[n_test:]], [train[i] for i in order[:n_test]], verifier)
