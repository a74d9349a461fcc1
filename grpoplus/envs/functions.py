"""The multi-turn form of function calling: the model calls the row's tools over several turns, each call
answered from the row's mock results (nothing runs), until it answers without a call.

``data.env=function_calling`` plays each row of a function-calling data set (:mod:`grpoplus.data.functions`) or
of the ``function_calling`` task: the prompt is the row's ``messages`` with its ``tools`` (rendered through the chat
template, or described in a system message with the call format stated; a row without ``messages``, the task's,
whose prompt lists its tools in one line, is played from its prompt as it is); each ``<tool_call>`` of a turn gets the
result of the first ``tool_results`` entry that names its function with the same arguments (compared as the reward
compares values: strings after BFCL's standardisation, numbers by value; an entry without ``arguments`` answers any
call of its function). A call no entry answers, a call of a tool the row does not offer and a call that is not
valid JSON are answered with an error and counted in ``env/tool_errors``; the episode goes on. A turn without a
call ends the episode. The environment gives no reward: the ``function_call`` reward (the task verifier of such
rows) scores every call of the transcript against the expected calls, in order unless the row is ``parallel``.
"""

from __future__ import annotations

import json

from grpoplus.data.functions import read_results
from grpoplus.envs.base import ENVS, StepResult
from grpoplus.envs.tools import parse_calls
from grpoplus.rewards.function_call import argument_mismatch
from grpoplus.rewards.tool_schemas import acceptable_value, read_tools


@ENVS.register("function_calling")
class FunctionCallEnv:
    """One episode over a function-calling row: ``tools``, optional ``messages`` and ``tool_results``."""

    def __init__(self, tools, tool_results=None, messages: list[dict] | None = None):
        schemas = read_tools(tools)
        self.functions = {t["function"]["name"]: t["function"] for t in schemas}
        self.results = read_results(tool_results, schemas) if tool_results else []
        self.messages = messages
        self.tool_schemas = schemas if messages else None  # the prompt renders them (none: the row's prompt lists them)

    def reset(self, **row) -> list[dict] | None:
        """The row's messages (None: its prompt)."""
        return list(self.messages) if self.messages else None

    def step(self, action: str) -> StepResult:
        calls = parse_calls(action)
        if not calls:
            return StepResult(None, None, True)
        answers = [self.answer(call) for call in calls]
        errors = sum(failed for _, failed in answers)
        return StepResult([{"role": "tool", "content": text} for text, _ in answers], None, False,
                          {"tool_calls": len(calls), "tool_errors": errors})

    def answer(self, call: tuple[str, dict] | str) -> tuple[str, bool]:
        """(the call's mock result as text, whether it failed)."""
        if isinstance(call, str):
            return call, True
        name, arguments = call
        if name not in self.functions:
            return f"error: no tool named {name!r}; the tools are {', '.join(sorted(self.functions))}", True
        properties = self.functions[name]["parameters"]["properties"]
        for entry in self.results:
            if entry["name"] == name and (entry["arguments"] is None or same_arguments(arguments, entry["arguments"],
                                                                                      properties)):
                result = entry["result"]
                return (result if isinstance(result, str) else json.dumps(result)), False
        return f"error: {name} has no result for the arguments {json.dumps(arguments)}", True


def same_arguments(given: dict, stated: dict, properties: dict) -> bool:
    """``given`` has exactly ``stated``'s arguments, each equal by the reward's value rules."""
    return set(given) == set(stated) and all(
        argument_mismatch(arg, value, [acceptable_value(stated[arg])], properties.get(arg, {})) is None
        for arg, value in given.items())
