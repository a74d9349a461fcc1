"""A function-calling row's tools and expected calls, read from the layouts data sets use, into one form.

Tools come as OpenAI's ``{"type": "function", "function": {"name", "description", "parameters"}}`` or the bare
``{"name", "description", "parameters"}`` (BFCL, xLAM), as a list or its JSON text. ``parameters`` is a JSON schema
(``{"type": "object", "properties": {...}, "required": [...]}``; BFCL's ``dict`` / ``float`` / ``tuple`` / ``any``
types read as ``object`` / ``number`` / ``array`` / no type) or xLAM's flat map ``{"arg": {"type": "str",
"description": ..., "default": ...}}`` (types ``str``, ``int``, ``float``, ``bool``, ``List[...]``, ``Dict``; an
argument with a default, or a type ending in ``, optional``, is optional). :func:`read_tools` returns OpenAI's form.

Expected calls come as a list (or one call, or its JSON text) of

- ``{"name": "f", "arguments": {"x": 1}}`` (xLAM's ``answers``; OpenAI's ``tool_calls`` entries too), or the text
  ``[f(x=1), g(y="a")]`` (ToolACE's assistant turns, BFCL's prompt format; literals only): exact values.
  An optional argument the call leaves out may be left out or given its schema ``default``; one it gives with the
  default value may be left out;
- BFCL's ground truth ``{"f": {"x": [1, 1.0], "unit": ["cm", ""]}}``: each argument maps to its acceptable values,
  ``""`` meaning it may be left out (an argument the tool does not take is dropped when it may be left out: a few
  of BFCL's own rows have one).

:func:`read_expected` returns them as ``[{"name": "f", "arguments": {"x": [1]}}]`` (acceptable values), which the
reward compares with (:mod:`grpoplus.rewards.function_call`); :func:`ground_truth` writes that back in BFCL's form,
which reads back the same. Anything else raises ``ValueError``: one line saying which tool or call,
what is wrong and what to write instead.
"""

from __future__ import annotations

import json
import re

from grpoplus.rewards.tool_calls import PYTHON_CALL, calls_in

OMITTED = ""
"""An acceptable value that means "the argument may be left out" (BFCL's convention)."""

JSON_TYPES = {"string": "string", "str": "string", "integer": "integer", "int": "integer", "number": "number",
              "float": "number", "boolean": "boolean", "bool": "boolean", "array": "array", "list": "array",
              "tuple": "array", "object": "object", "dict": "object", "null": "null"}
"""Type names of JSON schema, BFCL and xLAM -> JSON schema's; ``any`` (or a name not here) is no type at all."""

TOOL_LAYOUT = '{"type": "function", "function": {"name", "description", "parameters": {JSON schema}}}'
CALL_LAYOUT = '{"name": ..., "arguments": {...}} or BFCL\'s {"<name>": {"<argument>": [acceptable values]}}'


def _json(value, what: str):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError as err:
            raise ValueError(f"{what} is text that is not JSON ({err})") from None
    return value


def read_tools(value) -> list[dict]:
    """The row's tools in OpenAI's form (see the module docstring), else ``ValueError`` naming the tool."""
    tools = _json(value, "'tools'")
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, list) or not tools:
        raise ValueError(f"'tools' must be a non-empty list of tool schemas {TOOL_LAYOUT}, got "
                         f"{type(tools).__name__}")
    read = [_tool(tool, i) for i, tool in enumerate(tools, start=1)]
    names = [t["function"]["name"] for t in read]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"tool name(s) {twice} appear more than once in 'tools': give each tool its own name")
    return read


def _tool(tool, i: int) -> dict:
    function = tool.get("function", tool) if isinstance(tool, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError(f"tool {i} has no name: write each tool as {TOOL_LAYOUT}")
    name = function["name"]
    parameters = _json(function.get("parameters", {"type": "object", "properties": {}}), f"tool {name!r}: 'parameters'")
    if not isinstance(parameters, dict):
        raise ValueError(f"tool {name!r}: 'parameters' must be a JSON schema object "
                         '{"type": "object", "properties": {...}, "required": [...]}, '
                         f"got {type(parameters).__name__}")
    return {"type": "function", "function": {"name": name, "description": str(function.get("description", "")),
                                             "parameters": _parameters(name, parameters)}}


def _parameters(name: str, parameters: dict) -> dict:
    if _flat(parameters):
        return _xlam_parameters(parameters)
    properties = parameters.get("properties", {})
    required = parameters.get("required", [])
    if not isinstance(properties, dict) or not all(isinstance(p, dict) for p in properties.values()):
        raise ValueError(f"tool {name!r}: 'properties' must map each argument to its JSON schema")
    if not isinstance(required, list) or any(r not in properties for r in required):
        missing = [r for r in required if r not in properties] if isinstance(required, list) else required
        raise ValueError(f"tool {name!r}: 'required' lists {missing!r}, not among its properties "
                         f"({', '.join(properties) or 'none'}): list only arguments it describes")
    return {"type": "object", "properties": {k: _schema(v) for k, v in properties.items()}, "required": list(required)}


def _flat(parameters: dict) -> bool:
    """xLAM's layout: no ``properties``, and every entry (``type`` included, then an argument) a dict."""
    return "properties" not in parameters and bool(parameters) and all(isinstance(p, dict)
                                                                       for p in parameters.values())


def _schema(schema: dict) -> dict:
    """One argument's schema with its type names (and its items' and properties', one level each) made JSON
    schema's."""
    out = dict(schema)
    kind = JSON_TYPES.get(str(schema.get("type", "")).lower())
    out.pop("type", None)
    if kind:
        out["type"] = kind
    if isinstance(schema.get("items"), dict):
        out["items"] = _schema(schema["items"])
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: _schema(v) if isinstance(v, dict) else v for k, v in schema["properties"].items()}
    return out


def _xlam_parameters(flat: dict) -> dict:
    """xLAM's ``{"arg": {"type": "List[int], optional", "default": ...}}`` as a JSON schema."""
    properties, required = {}, []
    for arg, spec in flat.items():
        text = str(spec.get("type", "")).strip()
        optional = text.endswith("optional") or "default" in spec
        base = re.split(r"[\[,\s]", text, maxsplit=1)[0].lower() if text else ""
        schema = {k: v for k, v in spec.items() if k != "type"}
        if JSON_TYPES.get(base):
            schema["type"] = JSON_TYPES[base]
        item = re.match(r"\w+\[(\w+)\]", text)  # List[int]: its items' type
        if item and JSON_TYPES.get(item.group(1).lower()):
            schema["items"] = {"type": JSON_TYPES[item.group(1).lower()]}
        properties[arg] = schema
        if not optional:
            required.append(arg)
    return {"type": "object", "properties": properties, "required": required}


def read_expected(value, tools: list[dict]) -> list[dict]:
    """The expected calls in BFCL's form (see the module docstring), checked against ``tools`` (as
    :func:`read_tools` returns them), else ``ValueError`` naming the call."""
    calls = _python_form(value) if isinstance(value, str) and PYTHON_CALL.match(value.strip()) else \
        _json(value, "the expected calls")
    if isinstance(calls, dict):
        calls = [calls]
    if not isinstance(calls, list) or not calls:
        raise ValueError(f"the expected calls must be a non-empty list of {CALL_LAYOUT}, got {type(calls).__name__}")
    functions = {t["function"]["name"]: t["function"] for t in tools}
    return [_expected(call, i, functions) for i, call in enumerate(calls, start=1)]


def _python_form(text: str) -> list[dict]:
    """ToolACE's (and BFCL's prompt format's) ``[f(x=1), g(y="a")]`` as exact calls."""
    found = calls_in(text.strip())
    if found.invalid:
        raise ValueError(f"the expected calls {text.strip()[:60]!r}: {found.invalid[0]}")
    return [{"name": name, "arguments": arguments} for name, arguments in found.calls]


def ground_truth(expected: list[dict]) -> list[dict]:
    """Expected calls as :func:`read_expected` returns them, in BFCL's ground-truth form (which it reads back as
    they are)."""
    return [{call["name"]: call["arguments"]} for call in expected]


def _expected(call, i: int, functions: dict[str, dict]) -> dict:
    if isinstance(call, dict) and isinstance(call.get("function"), dict):
        call = call["function"]  # an OpenAI tool_calls entry
    if isinstance(call, dict) and isinstance(call.get("name"), str) and set(call) <= {"name", "arguments", "parameters"}:
        name, exact, bfcl = call["name"], _json(call.get("arguments", call.get("parameters", {})), "arguments"), False
    elif isinstance(call, dict) and len(call) == 1 and isinstance(next(iter(call.values())), dict):
        (name, exact), bfcl = next(iter(call.items())), True
    else:
        raise ValueError(f"expected call {i} ({json.dumps(call)[:60]}) is not {CALL_LAYOUT}")
    if name not in functions:
        raise ValueError(f"expected call {i} names {name!r}, which is not one of the row's tools "
                         f"({', '.join(functions)}): fix the call's name or add the tool")
    if not isinstance(exact, dict):
        raise ValueError(f"expected call {i} ({name!r}): its arguments must be an object")
    parameters = functions[name]["parameters"]
    if bfcl:  # an argument the tool does not take that may be left out can only be left out (BFCL's own rows)
        exact = {a: v for a, v in exact.items()
                 if a in parameters["properties"] or not (isinstance(v, list) and OMITTED in v)}
    unknown = [a for a in exact if a not in parameters["properties"]]
    if unknown:
        raise ValueError(f"expected call {i} ({name!r}) passes {unknown}, which the tool does not take (its "
                         f"arguments: {', '.join(parameters['properties']) or 'none'})")
    acceptable = _bfcl_arguments(name, i, exact) if bfcl else _exact_arguments(exact, parameters)
    missing = [a for a in parameters["required"] if a not in acceptable]
    if missing:
        raise ValueError(f"expected call {i} ({name!r}) leaves out the required argument(s) {missing}: give them")
    return {"name": name, "arguments": acceptable}


def _bfcl_arguments(name: str, i: int, arguments: dict) -> dict:
    wrong = [a for a, values in arguments.items() if not isinstance(values, list)]
    if wrong:
        raise ValueError(f"expected call {i} ({name!r}) is in BFCL's form, where each argument maps to a list of "
                         f"acceptable values, but {wrong} do not: write [value] (or [value, \"\"] if it may be left out)")
    return {a: list(values) for a, values in arguments.items()}


def _exact_arguments(arguments: dict, parameters: dict) -> dict:
    """Exact values as BFCL's acceptable values; the optional arguments' defaults and omission allowed (see the
    module docstring). A dict value becomes BFCL's ``{key: [value]}``, as does each dict of a list of dicts."""
    out = {}
    for arg, schema in parameters["properties"].items():
        optional = arg not in parameters["required"]
        if arg in arguments:
            out[arg] = [acceptable_value(arguments[arg])]
            if optional and "default" in schema and schema["default"] == arguments[arg]:
                out[arg].append(OMITTED)
        elif optional:
            out[arg] = [OMITTED] + ([acceptable_value(schema["default"])] if "default" in schema else [])
    return out


def acceptable_value(value):
    """An exact value as one of BFCL's acceptable values: an object's (and each object of a list's) values become
    lists of one."""
    if isinstance(value, dict):
        return {k: [v] for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [{k: [v] for k, v in item.items()} for item in value]
    return value
