"""Tasks: prompts, reference answers and verifiers, looked up by name in ``TASKS``.

Importing this package registers the built-in tasks (``arithmetic``, ``countdown``,
``function_calling``, ``wordproblems``, and the multi-turn ``guess``).
"""

from __future__ import annotations

import importlib.util
import inspect

from grpoplus.tasks import (  # noqa: F401  (registers the built-in tasks)
                            arithmetic,
                            countdown,
                            function_calling,
                            wordproblems,
)
from grpoplus.tasks.base import TASKS, Example, Task, without_prompts

if importlib.util.find_spec("reasoning_gym") is not None:  # the optional extra (grpoplus[envs]) is installed
    from grpoplus.tasks import reasoning_gym  # noqa: F401  (registers reasoning_gym; imports the package on first use)


def get_task(name: str, **kwargs) -> Task:
    """Build the registered task ``name`` with ``kwargs`` (e.g. ``difficulty=3, seed=0``).

    Raises ``ValueError`` listing the tasks for an unknown name, and naming the argument
    for a keyword the task does not take.
    """
    factory = TASKS.get(name)
    accepted = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
    unknown = sorted(k for k in kwargs if k not in accepted)
    if unknown and not takes_any:
        raise ValueError(
            f"task {name!r} does not take argument(s) {', '.join(unknown)}; it takes: {', '.join(accepted)}"
        )
    return factory(**kwargs)


__all__ = ["TASKS", "Example", "Task", "get_task", "without_prompts"]
