"""The call format: how a model states a function call, and how a text's calls are read back (never run).

The stated format, the one a chat template without tool support is told about (:func:`tools_system_text`) and
the one the Hermes / Qwen templates use, is one call per tag::

    <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>

:func:`calls_in` also reads a completion that states its call(s) without the tags: a JSON object (or a list of
them, optionally in a fenced code block; ``arguments`` may be a JSON string, as in OpenAI's ``tool_calls``, and
``parameters`` is read as ``arguments``), or BFCL's Python form ``[get_weather(city="Paris"), ...]``, whose
argument values must be literals: it is parsed with :mod:`ast`, never evaluated.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field

CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
FENCE = re.compile(r"```(?:json|python)?\s*\n?(.*?)```", re.DOTALL)
PYTHON_CALL = re.compile(r"^\[?\s*[A-Za-z_][\w.]*\(")
FORMAT = '{"name": ..., "arguments": {...}}'

Call = tuple[str, dict]
"""(function name, arguments)."""


@dataclass(frozen=True)
class FoundCalls:
    """The calls a text states, and why each one that could not be read was refused."""

    calls: list[Call] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)


def parse_call(body: str | dict) -> Call:
    """One call: a ``{"name", "arguments"}`` object (as JSON text or parsed), else ``ValueError`` saying why.

    >>> parse_call('{"name": "f", "arguments": "{\\\\"x\\\\": 1}"}')
    ('f', {'x': 1})
    """
    try:
        call = json.loads(body) if isinstance(body, str) else body
        call = call["function"] if isinstance(call, dict) and isinstance(call.get("function"), dict) else call
        name, arguments = call["name"], call.get("arguments", call.get("parameters", {}))
        if isinstance(arguments, str):  # OpenAI's tool_calls give the arguments as a JSON string
            arguments = json.loads(arguments)
        if not isinstance(name, str) or not isinstance(arguments, dict):
            raise TypeError("name must be a string and arguments an object")
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        shown = body.strip()[:80] if isinstance(body, str) else json.dumps(body)[:80]
        raise ValueError(f"the tool call {shown!r} is not valid {FORMAT} JSON ({err})") from None
    return name, arguments


def calls_in(text: str) -> FoundCalls:
    """Every call ``text`` states (see the module docstring): the tagged ones when there is a tag, else one JSON
    object or list, else the Python form; no call at all is an empty result, not an invalid one.

    >>> calls_in('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>').calls
    [('f', {'x': 1})]
    >>> calls_in('[f(x=1), g(y="a")]').calls
    [('f', {'x': 1}), ('g', {'y': 'a'})]
    >>> len(calls_in('<tool_call>{"name": "f", "arguments": {x: 1}}</tool_call>').invalid)
    1
    """
    bodies = CALL.findall(text)
    if bodies:
        return _read(bodies)
    fenced = FENCE.search(text)
    body = (fenced.group(1) if fenced else text).strip()
    if PYTHON_CALL.match(body):
        return _python_calls(body)
    start = min((i for i in (body.find("{"), body.find("[")) if i >= 0), default=-1)
    if start < 0:
        return FoundCalls()
    try:
        value, _ = json.JSONDecoder().raw_decode(body, start)
    except ValueError as err:
        return FoundCalls(invalid=[f"the call {body[start:start + 80]!r} is not valid JSON ({err})"])
    return _read(value if isinstance(value, list) else [value])


def _read(bodies: list) -> FoundCalls:
    found = FoundCalls()
    for body in bodies:
        try:
            found.calls.append(parse_call(body))
        except ValueError as err:
            found.invalid.append(str(err))
    return found


def _python_calls(text: str) -> FoundCalls:
    """``[f(a=1), g(b="x")]`` or ``f(a=1)``: names and literal keyword arguments, read with :mod:`ast` (nothing
    is evaluated)."""
    try:
        tree = ast.parse(text, mode="eval").body
        nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
        return FoundCalls(calls=[_python_call(node) for node in nodes])
    except (SyntaxError, ValueError, TypeError) as err:
        return FoundCalls(invalid=[f"the call {text[:80]!r} is not a list of calls with literal keyword "
                                   f"arguments ({err})"])


def _python_call(node: ast.AST) -> Call:
    if not isinstance(node, ast.Call) or node.args:
        raise ValueError("each call names its function and passes every argument by name")
    name = ast.unparse(node.func)
    if not re.fullmatch(r"[A-Za-z_][\w.]*", name):
        raise ValueError(f"{name!r} is not a function name")
    return name, {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}


def tools_system_text(schemas: list[dict]) -> str:
    """The system message that describes the tools and the call format (with an example call of the first tool)
    to a template that cannot."""
    functions = [s.get("function", s) for s in schemas]
    listed = "\n".join(json.dumps(f) for f in functions)
    return ("You can call these tools:\n" + listed + "\nTo call a tool, write "
            '<tool_call>{"name": "<tool name>", "arguments": {<arguments as JSON>}}</tool_call>, for example '
            f"<tool_call>{json.dumps(example_call(functions[0]))}</tool_call>. Its result comes back in the next "
            "message. When you are done, answer without a tool call.")


def example_call(function: dict) -> dict:
    """A call of ``function`` with a placeholder value of the right JSON type for each required argument."""
    placeholders = {"string": "...", "integer": 1, "number": 1.0, "boolean": True, "array": [], "object": {}}
    properties = function.get("parameters", {}).get("properties", {})
    required = function.get("parameters", {}).get("required", list(properties))
    return {"name": function["name"],
            "arguments": {k: placeholders.get(properties[k].get("type"), "...") for k in required if k in properties}}
