"""Function-calling rows: a row that carries its own tool schemas and the call(s) expected of the model.

A row (one JSON object; BFCL's, xLAM's and this project's layouts read as they are)::

    {"tools": [{"type": "function", "function": {"name": "get_weather", "description": "...",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
     "messages": [{"role": "user", "content": "Weather in Paris?"}],
     "answer": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
     "parallel": false,
     "tool_results": [{"name": "get_weather", "arguments": {"city": "Paris"}, "result": "18 C, sunny"}]}

- the tools: ``tools`` (BFCL: ``function``), in a layout :func:`grpoplus.rewards.tool_schemas.read_tools` reads;
- the prompt: ``messages`` (chat messages), else the ``prompt_field`` string, else BFCL's ``question`` (a list of
  turns, each a list of messages: the first turn is the prompt) or xLAM's ``query``;
- the expected calls: the ``answer_field``, else BFCL's ``ground_truth`` or xLAM's ``answers``, in a layout
  :func:`grpoplus.rewards.tool_schemas.read_expected` reads;
- ``parallel`` (optional): the calls may come in any order; without the field, a row whose ``id`` names a BFCL
  parallel category (``parallel_3``, ``live_parallel_multiple_0``) is parallel, as BFCL's checker decides;
- ``tool_results`` (optional, the multi-turn environment's mock answers): a list of ``{"name", "arguments"
  (optional: any arguments), "result"}``, or ``{tool name: result}``.

Every other column is kept as a field. A row that breaks the layout raises ``ValueError``: one line with the
problem and the fix (the loader adds the row's line number).
"""

from __future__ import annotations

import json

from grpoplus.rewards.tool_schemas import ground_truth, read_expected, read_tools

TOOL_FIELDS = ("tools", "function")
PROMPT_FIELDS = ("messages", "question", "query")
ANSWER_FIELDS = ("ground_truth", "answers")
CONSUMED = {*TOOL_FIELDS, *PROMPT_FIELDS, *ANSWER_FIELDS, "parallel", "tool_results"}


def is_function_call_row(row: object) -> bool:
    """The row carries its own tools: a function-calling row."""
    return isinstance(row, dict) and any(name in row for name in TOOL_FIELDS)


def function_call_record(row: dict, prompt_field: str = "prompt", answer_field: str = "answer") -> dict:
    """``{"prompt", "answer", "fields"}`` of a function-calling row (see the module docstring): ``prompt`` the
    messages' text, ``answer`` the expected calls as JSON in BFCL's ground-truth form, and the ``fields`` ``tools`` (OpenAI's
    form), ``messages``, ``parallel`` and ``tool_results`` beside the row's other columns."""
    tools = read_tools(_first(row, TOOL_FIELDS, "tools", "a 'tools' list of the row's tool schemas"))
    messages = _messages(row, prompt_field)
    expected = read_expected(_first(row, (answer_field, *ANSWER_FIELDS), "expected calls",
                                     f"the expected calls in '{answer_field}'"), tools)
    fields = {k: v for k, v in row.items() if k not in CONSUMED | {prompt_field, answer_field}}
    fields.update(tools=tools, messages=messages, parallel=_parallel(row))
    if row.get("tool_results") is not None:
        fields["tool_results"] = read_results(row["tool_results"], tools)
    return {"prompt": "\n\n".join(m["content"] for m in messages), "answer": json.dumps(ground_truth(expected)),
            "fields": fields}


def _first(row: dict, names: tuple[str, ...], what: str, fix: str):
    for name in names:
        if row.get(name) is not None:
            return row[name]
    raise ValueError(f"no {what} (looked for {', '.join(repr(n) for n in names)}): give the row {fix}")


def _messages(row: dict, prompt_field: str) -> list[dict]:
    value = _first(row, ("messages", prompt_field, "question", "query"), "prompt",
                   f"'messages' (a list of chat messages) or a '{prompt_field}' string")
    if isinstance(value, str):
        value = [{"role": "user", "content": value}]
    if isinstance(value, list) and value and isinstance(value[0], list):  # BFCL: a list of turns
        value = value[0]
    if not isinstance(value, list) or not value or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in value):
        raise ValueError('the prompt must be a non-empty string or a list of {"role": ..., "content": "..."} '
                         "messages")
    if not any(m["content"].strip() for m in value):
        raise ValueError("the prompt's messages are all empty: give the user's request")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _parallel(row: dict) -> bool:
    value = row.get("parallel")
    if value is None:
        return "parallel" in str(row.get("id", ""))
    if not isinstance(value, bool):
        raise ValueError(f"'parallel' must be true or false, got {value!r}")
    return value


def read_results(value, tools: list[dict]) -> list[dict]:
    """``tool_results`` as a list of ``{"name", "arguments" (None: any), "result"}``, each naming one of ``tools``,
    else ``ValueError``."""
    try:
        results = json.loads(value) if isinstance(value, str) else value
    except ValueError as err:
        raise ValueError(f"'tool_results' is text that is not JSON ({err})") from None
    if isinstance(results, dict):
        results = [{"name": name, "result": result} for name, result in results.items()]
    if not isinstance(results, list) or not all(isinstance(r, dict) and "name" in r and "result" in r
                                                for r in results):
        raise ValueError("'tool_results' must be a list of {\"name\", \"arguments\", \"result\"} or a "
                         "{tool name: result} object")
    names = {t["function"]["name"] for t in tools}
    unknown = sorted({r["name"] for r in results} - names)
    if unknown:
        raise ValueError(f"'tool_results' answers {unknown}, not among the row's tools ({', '.join(sorted(names))})")
    return [{"name": r["name"], "arguments": r.get("arguments"), "result": r["result"]} for r in results]
