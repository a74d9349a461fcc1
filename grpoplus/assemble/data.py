"""The data factory: the examples a run trains and is evaluated on, made from its data plan
(:class:`grpoplus.plan.data.DataPlan`): a built-in task's splits (training problems from the run's seed, held-out
ones from ``data.eval_seed``) or a data set's. The assembly hands them to the roles and the dry run measures their
prompts. No weight is loaded to make them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from grpoplus.data.lengths import PromptFit, fit_prompts, prompt_limit
from grpoplus.models.vision import image_counter, processor_of
from grpoplus.plan.data import DataPlan

if TYPE_CHECKING:
    from grpoplus.tasks.dataset import DataRows


def builtin_tasks(data: DataPlan, seed: int) -> tuple | None:
    """(task, held_out) of a built-in task: its training problems from ``seed`` (``run.seed``), its held-out ones
    from ``data.eval_seed``; None for a data set."""
    from grpoplus.tasks import get_task

    if not data.builtin:
        return None
    kwargs = dict(data.task_kwargs, **({} if data.difficulty is None else {"difficulty": data.difficulty}))
    task = get_task(data.task, seed=seed, **kwargs)
    return task, (task if data.eval_seed == seed else get_task(data.task, seed=data.eval_seed, **kwargs))


def data_rows(data: DataPlan) -> DataRows | None:
    """The records of a data set (``data.data``), its rows checked, read before any model loads (a bad row is
    refused or skipped before minutes of loading); None for a built-in task."""
    from grpoplus.tasks.dataset import read_rows

    return None if data.builtin else read_rows(data)


def build_data(data: DataPlan, tokenizer, seed: int, tasks: tuple | None = None,
               rows: DataRows | None = None) -> tuple[object, list, list]:
    """(task, train, test): the held-out problems come from ``data.eval_seed``, the training ones from ``seed``
    (``run.seed``), and no training prompt is a held-out one (splits of different seeds may share problems).
    A task of chat prompts goes through the tokenizer's chat template (``data.chat_template``), except in a multi-turn
    run: its episodes render the opening messages themselves (:mod:`grpoplus.envs.render`). ``tasks``: a built-in
    task's as :func:`builtin_tasks` made them, ``rows``: a data set's records as :func:`data_rows` read them (each
    made here when not given)."""
    task, held_out = _splits(data, tokenizer, tasks or builtin_tasks(data, seed), rows)
    test = list(held_out.split("test"))
    train = task.split("train")
    _check_images_shown(train, test, tokenizer, data.model)
    return task, _without_held_out(train, test), test


def _check_images_shown(train: list, test: list, tokenizer, model: str | None) -> None:
    """A row with images and a text policy (its tokenizer carries no processor): one line naming the row."""
    from grpoplus.tasks.dataset import images_for_text_model

    if processor_of(tokenizer) is not None:
        return
    shown = next((ex for ex in (*train, *test) if getattr(ex, "images", ())), None)
    if shown is not None:
        raise ValueError(images_for_text_model(shown.origin or "a row", len(shown.images), model))


def _splits(data: DataPlan, tokenizer, tasks: tuple | None, rows: DataRows | None) -> tuple:
    """(task, held_out): the task whose training split is trained on and the one whose test split is held out,
    their chat prompts through the chat template where the run applies it."""
    from grpoplus.tasks.dataset import dataset_task
    from grpoplus.tasks.synthetic import with_chat_template

    chat = data.chat_template and not data.multi_turn
    if tasks is None:  # the held-out rows of a split data set are chosen by eval_seed
        task = dataset_task(data, tokenizer if chat else None, seed=data.eval_seed, rows=rows)
        return task, task
    if getattr(tasks[0], "chat", False) and chat:
        return tuple(with_chat_template(t, tokenizer, data.model) for t in tasks)
    return tasks


def _without_held_out(train, test: list) -> list:
    """The training examples no held-out one shares its problem with; refused when none is left."""
    from grpoplus.tasks import without_prompts

    kept = without_prompts(train, test)
    if train and not kept:
        raise ValueError(f"every one of the {len(train)} training rows shares its problem with a held-out row (the "
                         "held-out guard drops a training row whose prompt, or problem_id, a held-out row has): give "
                         "each row a problem_id field (rows that share one prompt, as when an environment draws its own "
                         "task) or held-out rows of their own (data.eval_data)")
    return kept


def fit_prompt_lengths(data: DataPlan, tokenizer, context: int | None, train: list, test: list) -> PromptFit:
    """The training and held-out examples whose prompts fit ``data.max_prompt_tokens`` (by default ``context``, the
    model's positions, minus ``rollout.max_new_tokens``), per ``data.long_prompts`` (:mod:`grpoplus.data.lengths`):
    each prompt measured once, as the engine encodes it. A multi-turn run's are left as they are: its episodes render
    the opening messages themselves and fit each turn's response to the room left (:mod:`grpoplus.envs.episodes`)."""
    if data.multi_turn:
        return PromptFit(list(train), list(test))
    limit = prompt_limit(context, data.max_new_tokens, data.max_prompt_tokens)
    fit = fit_prompts(train, test, tokenizer, limit, data.long_prompts, image_counter(tokenizer))
    note = fit.note(limit) if limit is not None else None
    if note:
        print(note, file=sys.stderr)
    return fit
