"""Tool use: plain functions (or a TRL-style environment class's public methods) as tools the policy calls.

A tool is a callable with type hints and a Google-style docstring (``Args:``); its JSON schema comes from
transformers' ``get_json_schema``. The policy calls tools in the stated format, one call per tag::

    <tool_call>{"name": "calculator", "arguments": {"expression": "12*7"}}</tool_call>

(the format of the Hermes / Qwen chat templates). Each call runs and its result is appended as a ``tool`` message;
a turn with no call is the final answer and ends the episode. A tool may return a ``PIL.Image`` (or a list of
``{"type": "text" | "image", ...}`` parts): a vision-language policy sees the picture as the tool's result. A tool
that raises, an unknown tool, or a call that is not valid JSON answers the model with the error as the tool's
result (counted in ``env/tool_errors``), and the episode goes on. A chat template that takes ``tools`` renders the
schemas itself; any other (SmolLM2's plain ChatML, the character model) gets them in a system message with the call
format stated (:func:`grpoplus.rewards.tool_calls.tools_system_text`).

Built-in tools: ``calculator`` (arithmetic, no names or calls) and ``python`` (runs code in grpoplus's code
sandbox: :func:`grpoplus.rewards.sandbox.run_python`, no host files, no network).
"""

from __future__ import annotations

import ast
import inspect
import json
import operator
import sys
from typing import Any, Callable

from grpoplus.core.registry import Registry, import_object
from grpoplus.envs.base import StepResult
from grpoplus.envs.vision_turns import row_opening
from grpoplus.rewards.tool_calls import CALL, parse_call

RESERVED = {"reset", "step", "close", "get_reward"}  # a tool class's methods that are not tools
TOOLS: Registry = Registry("tool")


def schema(fn: Callable) -> dict:
    """The tool's JSON schema (OpenAI function format) from its signature and docstring."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as err:  # noqa: BLE001 - transformers raises several kinds; say which tool and why
        raise ValueError(f"tool {getattr(fn, '__name__', fn)!r} cannot be described to the model ({err}): give it "
                         "type hints and a docstring with an Args: section") from None


def parse_calls(text: str) -> list[tuple[str, dict] | str]:
    """Each ``<tool_call>`` of ``text`` as ``(name, arguments)``, or an error string for a malformed one."""
    calls: list[tuple[str, dict] | str] = []
    for body in CALL.findall(text):
        try:
            calls.append(parse_call(body))
        except ValueError as err:
            calls.append(f"error: {err}")
    return calls


def run_call(tools: dict[str, Callable], call) -> tuple[str | list, bool]:
    """(the call's result as text, or as content parts where it is an image or parts already, whether it failed)."""
    if isinstance(call, str):
        return call, True
    name, arguments = call
    if name not in tools:
        return f"error: no tool named {name!r}; the tools are {', '.join(sorted(tools))}", True
    try:
        result = tools[name](**arguments)
    except Exception as err:  # noqa: BLE001 - a tool's error is the model's to read
        return f"error: {type(err).__name__}: {err}", True
    if _is_image(result):  # a vision-language policy sees it (a text policy's trajectory ends, counted)
        return [{"type": "image", "image": result}], False
    if isinstance(result, list) and result and all(isinstance(p, dict) and p.get("type") in ("text", "image")
                                                   for p in result):
        return result, False
    return result if isinstance(result, str) else json.dumps(result, default=str), False


def _is_image(value) -> bool:
    """A ``PIL.Image`` (what a tool returns to show a picture)."""
    image = getattr(sys.modules.get("PIL.Image"), "Image", None)  # no PIL imported: no image
    return image is not None and isinstance(value, image)


class ToolEnv:
    """An episode of tool use over one data row: the policy calls tools until it answers without a call.

    ``reward``: called once at the end (a TRL-style class's ``get_reward``); None: the episode gives no reward (the
    reward functions score the transcript). ``first``: text appended to the row's prompt (a class's ``reset``)."""

    def __init__(self, tools: list[Callable], reward: Callable[[], float] | None = None,
                 first: Callable[..., Any] | None = None):
        self.tools = {fn.__name__: fn for fn in tools}
        self.tool_schemas = [schema(fn) for fn in tools]
        self.reward, self.first = reward, first

    def reset(self, **row):
        extra = self.first(**row) if self.first is not None else None
        prompt = row["prompt"] + (f"\n\n{extra}" if extra else "")
        images = row.get("images") or ()  # a row's images, shown before its text (a vision-language policy's)
        if images and isinstance(row["prompt"], str):
            return row_opening(prompt, tuple(images))
        return [{"role": "user", "content": prompt}]

    def step(self, action: str) -> StepResult:
        calls = parse_calls(action)
        if not calls:
            return StepResult(None, None if self.reward is None else float(self.reward()), True)
        results = [run_call(self.tools, call) for call in calls]
        errors = sum(failed for _, failed in results)
        return StepResult([{"role": "tool", "content": text} for text, _ in results], None, False,
                          {"tool_calls": len(calls), "tool_errors": errors})


def tool_class_env(obj) -> ToolEnv:
    """A TRL-style environment object (``reset(**row)``, public methods as tools, optional ``get_reward()``)."""
    methods = [getattr(obj, name) for name in dir(obj) if not name.startswith("_") and name not in RESERVED
               and inspect.ismethod(getattr(obj, name))]
    if not methods:
        raise ValueError(f"{type(obj).__name__} has neither step() nor public methods to use as tools: an environment "
                         "needs one or the other")
    return ToolEnv(methods, getattr(obj, "get_reward", None), getattr(obj, "reset", None))


def resolve_tools(specs: list[str]) -> list[Callable]:
    """``data.tools``: built-in tool names or ``module:function`` / ``file.py:function``."""
    found = []
    for spec in specs:
        fn = import_object(spec) if ":" in spec else TOOLS.get(spec)
        if not callable(fn):
            raise ValueError(f"data.tools: {spec!r} is not callable")
        schema(fn)  # refused now, not at the first rollout
        found.append(fn)
    return found


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg,
        ast.UAdd: operator.pos}


@TOOLS.register("calculator")
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression.

    Args:
        expression: numbers with + - * / // % ** and parentheses, e.g. "(12+3)*4"
    """
    def value(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return _OPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.operand))
        raise ValueError(f"{ast.dump(node)[:40]} is not arithmetic")

    result = value(ast.parse(expression.strip(), mode="eval").body)
    return str(int(result) if isinstance(result, float) and result.is_integer() else result)


@TOOLS.register("python")
def python(code: str) -> str:
    """Run Python code in a sandbox and return what it printed.

    Args:
        code: a Python program; print what you want to see
    """
    from grpoplus.rewards.sandbox import run_python

    result = run_python(code, timeout_s=10.0)
    out = (result.stdout + result.stderr).strip()
    return out[-2000:] if out else f"(no output; {result.status})"
