"""Demonstrations the project writes itself (``sft.demos=NAME``), from the run's own training problems.

``wordproblems-calculator``: each word problem (``--task wordproblems``) solved with the calculator tool, one call
per worked step, its result coming back as the tool's message, then the GSM8K answer line::

    user:      Mia has 12 dollars. ... How many dollars does Mia have now? Give the final answer ...
    assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "12 + 5"}}</tool_call>
    tool:      17
    assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "17 - 9"}}</tool_call>
    tool:      8
    assistant: #### 8

The row carries the calculator's schema in ``tools``, so the prompt states the tools as a tool-use run's does
(``data.tools=[calculator]``): the same ids the policy later samples from.
"""

from __future__ import annotations

import json
import re
from typing import Callable

STEP = re.compile(r"^\s*(.+?)\s*=\s*(-?\d+)\s*$")


def calculator_row(example) -> dict:
    """A word problem's demonstration with the calculator (module docstring)."""
    from grpoplus.envs.tools import calculator, schema

    msgs: list[dict] = [{"role": "user", "content": example.prompt}]
    for line in example.fields["solution"].splitlines():
        match = STEP.match(line)
        if match is None:
            raise ValueError(f"wordproblems-calculator: the worked line {line!r} is not 'expression = value'")
        expression = match.group(1)
        call = {"type": "function", "function": {"name": "calculator",
                                                 "arguments": json.dumps({"expression": expression})}}
        msgs += [{"role": "assistant", "tool_calls": [call]}, {"role": "tool", "content": calculator(expression)}]
    msgs.append({"role": "assistant", "content": f"#### {example.answer}"})
    return {"messages": msgs, "tools": [schema(calculator)]}


BUILTIN_DEMOS: dict[str, tuple[str, Callable]] = {"wordproblems-calculator": ("wordproblems", calculator_row)}
"""name -> (the task whose training problems it demonstrates, example -> row)."""


def check_builtin_demos(name: str, task_name: str) -> None:
    """Refuse the built-in demonstrations ``name`` for another task's problems: the one statement of this refusal, for
    :func:`builtin_rows` and the config rule ``supervised_stage``."""
    task = BUILTIN_DEMOS[name][0]
    if task_name != task:
        raise ValueError(f"sft.demos={name} demonstrates the {task} task's problems: add --task {task} "
                         f"(the run's task is {task_name!r})")


def builtin_rows(name: str, task_name: str, examples: list) -> list[dict]:
    """The rows of the built-in demonstrations ``name`` for the run's training ``examples``."""
    check_builtin_demos(name, task_name)
    return [BUILTIN_DEMOS[name][1](example) for example in examples]
