"""The examples a run trains and is evaluated on, read once from the config: a built-in task's splits (training
problems from ``run.seed``, held-out ones from ``data.eval_seed``) or a data set's; the assembly hands them to the
roles and the dry run measures their prompts. No weight is loaded to make them."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from grpoplus.config import Config, env_of
from grpoplus.data.lengths import PromptFit, fit_prompts, prompt_limit

if TYPE_CHECKING:
    from grpoplus.tasks.dataset import DataRows


def builtin_tasks(cfg: Config) -> tuple | None:
    """(task, held_out) of a built-in task: its training problems from ``run.seed``, its held-out ones
    from ``data.eval_seed``; None for a data set."""
    from grpoplus.tasks import get_task

    d = cfg.data
    if d.data is not None:
        return None
    kwargs = dict(d.task_kwargs, **({} if d.difficulty is None else {"difficulty": d.difficulty}))
    task = get_task(d.task, seed=cfg.run.seed, **kwargs)
    return task, (task if d.eval_seed == cfg.run.seed else get_task(d.task, seed=d.eval_seed, **kwargs))


def data_rows(cfg: Config) -> DataRows | None:
    """The records of a data set (``data.data``), its rows checked, read before any model loads (a bad row is
    refused or skipped before minutes of loading); None for a built-in task."""
    from grpoplus.tasks.dataset import read_rows

    return read_rows(cfg.data) if cfg.data.data is not None else None


def build_data(cfg: Config, tokenizer, tasks: tuple | None = None,
               rows: DataRows | None = None) -> tuple[object, list, list]:
    """(task, train, test): the held-out problems come from ``data.eval_seed``, the training ones from
    ``run.seed``, and no training prompt is a held-out one (splits of different seeds may share problems).
    A task of chat prompts goes through the tokenizer's chat template (``data.chat_template``), except in a multi-turn
    run: its episodes render the opening messages themselves (:mod:`grpoplus.envs.render`). ``rows``: a data set's
    records as :func:`data_rows` read them (read here when not given)."""
    from grpoplus.tasks import without_prompts
    from grpoplus.tasks.dataset import dataset_task
    from grpoplus.tasks.synthetic import with_chat_template

    d = cfg.data
    tasks = tasks or builtin_tasks(cfg)
    chat = d.chat_template and env_of(d) is None
    if tasks is None:  # the held-out rows of a split data set are chosen by eval_seed
        task = dataset_task(d, tokenizer if chat else None, seed=d.eval_seed, rows=rows)
        held_out = task
    elif getattr(tasks[0], "chat", False) and chat:
        task, held_out = (with_chat_template(t, tokenizer, cfg.learner.model) for t in tasks)
    else:
        task, held_out = tasks
    test = list(held_out.split("test"))
    train = task.split("train")
    kept = without_prompts(train, test)
    if train and not kept:
        raise ValueError(f"every one of the {len(train)} training rows shares its problem with a held-out row (the "
                         "held-out guard drops a training row whose prompt, or problem_id, a held-out row has): give "
                         "each row a problem_id field (rows that share one prompt, as when an environment draws its own "
                         "task) or held-out rows of their own (data.eval_data)")
    return task, kept, test


def fit_prompt_lengths(cfg: Config, tokenizer, context: int | None, train: list, test: list) -> PromptFit:
    """The training and held-out examples whose prompts fit ``data.max_prompt_tokens`` (by default ``context``, the
    model's positions, minus ``rollout.max_new_tokens``), per ``data.long_prompts`` (:mod:`grpoplus.data.lengths`):
    each prompt measured once, as the engine encodes it. A multi-turn run's are left as they are: its episodes render
    the opening messages themselves and fit each turn's response to the room left (:mod:`grpoplus.envs.episodes`)."""
    if env_of(cfg.data) is not None:
        return PromptFit(list(train), list(test))
    limit = prompt_limit(context, cfg.rollout.max_new_tokens, cfg.data.max_prompt_tokens)
    fit = fit_prompts(train, test, tokenizer, limit, cfg.data.long_prompts)
    note = fit.note(limit) if limit is not None else None
    if note:
        print(note, file=sys.stderr)
    return fit
