"""Tasks: prompts, reference answers and verifiers, looked up by name in ``TASKS``.

Importing this package registers the built-in tasks (``arithmetic``, ``countdown``,
``function_calling``, ``wordproblems``, the vision-language ``shapes``, and the multi-turn ``guess``).
"""

from __future__ import annotations

import importlib.util
import inspect

from grpoplus.tasks import (  # noqa: F401  (registers the built-in tasks)
                            arithmetic,
                            countdown,
                            function_calling,
                            shapes,
                            wordproblems,
)
from grpoplus.tasks.base import TASKS, Example, Task, without_prompts

if importlib.util.find_spec("reasoning_gym") is not None:  # the optional extra (grpoplus[envs]) is installed
    from grpoplus.tasks import reasoning_gym  # noqa: F401  (registers reasoning_gym; imports the package on first use)


OPTIONAL_TASKS = {"reasoning_gym": "task reasoning_gym needs the reasoning-gym package: pip install 'grpoplus[envs]'"}
"""Tasks registered only where their package is installed: name -> the line that says how to install it."""


def check_task_args(name: str, **kwargs) -> None:
    """Refuse, before anything is built, what ``get_task(name, **kwargs)`` would: an unknown task (listing the
    tasks), a keyword it does not take, a value its factory's ``check_args`` refuses (a difficulty outside its
    levels, ...). :func:`get_task` and the config rule ``task`` ask it; a task whose package this machine lacks is
    an ``ImportError`` (noted by a dry run: grpoplus.core.needs)."""
    if name not in TASKS and name in OPTIONAL_TASKS:
        from grpoplus.core.needs import unmet

        unmet(ImportError(OPTIONAL_TASKS[name]))
        return
    factory = TASKS.get(name)
    accepted = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    unknown = sorted(k for k in kwargs if k not in accepted)
    if unknown and not takes_any:
        raise ValueError(
            f"task {name!r} does not take argument(s) {', '.join(unknown)}; it takes: {', '.join(accepted)}"
        )
    check = getattr(factory, "check_args", None)
    if check is not None:
        check(**kwargs)


def check_chat_prompts(task: str, chat: bool, chat_template: bool, builtin_model: bool) -> None:
    """Refuse a task of chat prompts (``chat``, put through the tokenizer's chat template: ``data.chat_template``)
    for the built-in tiny model, whose character tokenizer has no template: the one statement of this refusal, for
    the task factory (grpoplus.assemble) and the config rule ``task``."""
    if chat and chat_template and builtin_model:
        raise ValueError(f"data.task={task} writes chat prompts for an instruct model, and the built-in tiny model "
                         "(learner.model) has no chat template: pass --model (e.g. smollm2), or "
                         "data.chat_template=false to warm-start the built-in tiny model on the raw prompts")


def get_task(name: str, **kwargs) -> Task:
    """Build the registered task ``name`` with ``kwargs`` (e.g. ``difficulty=3, seed=0``).

    Raises ``ValueError`` listing the tasks for an unknown name, naming the argument for a keyword the task does
    not take, and naming a value it refuses (:func:`check_task_args`).
    """
    check_task_args(name, **kwargs)
    return TASKS.get(name)(**kwargs)


__all__ = ["OPTIONAL_TASKS", "TASKS", "Example", "Task", "check_chat_prompts", "check_task_args", "get_task",
           "without_prompts"]
