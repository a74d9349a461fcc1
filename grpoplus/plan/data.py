"""The examples a run trains and is evaluated on, as the config decides them (:class:`DataPlan`): a built-in task and
its knobs or a data set's files and fields, the held-out set's seed and size, the chat template, the prompt limit.
The data factory (:mod:`grpoplus.assemble.data`) makes the examples from it; it imports no torch and reads no file."""

from __future__ import annotations

from dataclasses import dataclass

from grpoplus.config import Config, env_of


@dataclass(frozen=True, kw_only=True)
class DataPlan:
    """The data section's settings the examples are made from, named as the keys are (``data.*``), so the data set
    readers (:func:`grpoplus.tasks.dataset.read_rows`, :func:`~grpoplus.tasks.dataset.dataset_task`) take it as
    they take the section. The training problems' seed is the run's (``RunPlan.seed``), not recorded here."""

    task: str  # a built-in task, or with ``data`` the name shown in logs
    task_kwargs: tuple[tuple[str, object], ...]  # the built-in task factory's extra keyword arguments, as items
    difficulty: int | None  # None: the built-in task's default
    data: str | None  # a data set's file or directory; None: the built-in task
    eval_data: str | None  # the data set's held-out file (None: a split of ``data``)
    eval_size: int  # at most this many rows held out of a split data set
    eval_seed: int  # the held-out problems: the built-in task's test split, or the rows a data set holds out
    prompt_field: str
    answer_field: str
    answer_format: str  # raw | gsm8k | math | auto
    on_bad_row: str  # skip | error
    chat_template: bool  # chat prompts through the tokenizer's chat template (single-turn only)
    env: str | None  # the environment a multi-turn run's rows are played in (None: single-turn)
    max_prompt_tokens: int | None  # None: the model's context minus ``max_new_tokens``
    long_prompts: str  # refuse | truncate_left | drop
    max_new_tokens: int  # rollout.max_new_tokens: the room a prompt leaves for its response
    model: str | None  # learner.model: the built-in tiny model's check, the chat template's error message

    @property
    def builtin(self) -> bool:
        """A built-in task's problems (no data set)."""
        return self.data is None

    @property
    def multi_turn(self) -> bool:
        """The rows are played in an environment, whose episodes render the opening messages themselves."""
        return self.env is not None


def data_plan(cfg: Config) -> DataPlan:
    d = cfg.data
    return DataPlan(task=d.task, task_kwargs=tuple(dict(d.task_kwargs).items()), difficulty=d.difficulty, data=d.data,
                    eval_data=d.eval_data, eval_size=d.eval_size, eval_seed=d.eval_seed, prompt_field=d.prompt_field,
                    answer_field=d.answer_field, answer_format=d.answer_format, on_bad_row=d.on_bad_row,
                    chat_template=d.chat_template, env=env_of(d), max_prompt_tokens=d.max_prompt_tokens,
                    long_prompts=d.long_prompts, max_new_tokens=cfg.rollout.max_new_tokens, model=cfg.learner.model)
