"""The ``function_call`` reward: the calls a completion states, compared with the row's expected calls the way
BFCL's AST checker compares them (``bfcl_eval/eval_checker/ast_eval/ast_checker.py``, its Python rules). Nothing
is executed.

The rules, in the order they are checked:

1. **Count.** As many calls as expected. In order, unless the row says ``parallel`` (BFCL's parallel categories):
   then each expected call is matched with a different call, in any order. A maximum matching is searched, where
   BFCL's greedy pass can miss one when a call fits two expected calls (a departure).
2. **Name.** Exactly the expected function's.
3. **Arguments.** Every argument the schema requires is given; no argument the schema or the expected call does not
   name (an extra argument scores 0); every expected argument is given unless ``""`` is among its acceptable values
   (an optional one the data allows to be left out, see :mod:`grpoplus.rewards.tool_schemas`).
4. **Types.** A value has its schema type: an integer is accepted where a ``number`` (BFCL: ``float``) is expected,
   not a float where an ``integer`` is, and a boolean is never a number; a value of the type of the expected values
   is accepted too (BFCL's "variable" case). Array items: the same rules one level down, against each acceptable list
   (an item of the type of that list's items is accepted; BFCL refuses integers in an array of floats, here they are
   accepted, as at the top level). An argument without a type (BFCL's ``any``)
   takes any value.
5. **Values.** Strings after BFCL's standardisation (spaces and ``, . / - _ * ^`` removed, lowercase, ``'`` read as
   ``"``: "New York, NY" equals "new york ny"); lists element by element in order, their strings standardised; an
   object key by key against each key's acceptable values (a key may be missing when ``""`` is acceptable); a list
   of objects in order, each so; any other value by ``==`` (so ``2 == 2.0``).

A completion scores 1.0 when every rule holds, else 0.0; with ``partial=true`` it scores the share of expected calls
matched, divided by the larger of the two counts (so an extra call costs). A call that cannot be read (invalid
JSON, a Python call with a non-literal argument) scores 0 and is counted (``reward/function_call/calls_invalid``),
as is a completion that states no call (``calls_none``). A row whose tools or expected calls cannot be read raises a
one-line ``ValueError`` (the data loader refuses such rows before the model loads).
"""

from __future__ import annotations

import re

from grpoplus.rewards.events import count_event
from grpoplus.rewards.registry import REWARDS
from grpoplus.rewards.tool_calls import Call, calls_in
from grpoplus.rewards.tool_schemas import OMITTED, read_expected, read_tools

TYPES = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,), "array": (list,),
         "object": (dict,), "null": (type(None),)}


def standardise(text: str) -> str:
    """BFCL's string standardisation.

    >>> standardise("New York, NY") == standardise("new york ny")
    True
    """
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _std(value):
    return standardise(value) if isinstance(value, str) else value


def typed(value, kind: str | None) -> bool:
    """``value`` has the JSON schema type ``kind`` (no type: any value); an int is a number, a bool is not."""
    if kind not in TYPES:
        return True
    if isinstance(value, bool) and kind != "boolean":
        return False
    return isinstance(value, TYPES[kind])


def argument_mismatch(arg: str, value, acceptable: list, schema: dict) -> str | None:
    """Why ``value`` is not one of the ``acceptable`` values of argument ``arg`` (rules 4 and 5), or None."""
    answers = [a for a in acceptable if not (isinstance(a, str) and a == OMITTED)]
    kind = schema.get("type")
    variable = bool(answers) and not typed(answers[0], kind)
    if not typed(value, kind) and not (answers and type(value) is type(answers[0])):
        return f"{arg!r}: {value!r} is not of type {kind}"
    items = schema.get("items", {}).get("type") if isinstance(schema.get("items"), dict) else None
    if isinstance(value, list) and not variable and not _items_typed(value, items, answers):
        return f"{arg!r}: an item of {value!r} is not of type {items}"
    if variable or not isinstance(value, (str, list, dict)):
        ok = value in answers
    elif isinstance(value, str):
        ok = standardise(value) in [standardise(a) for a in answers if isinstance(a, str)]
    elif isinstance(value, dict):
        ok = any(_object_ok(value, a) for a in answers if isinstance(a, dict))
    elif items == "object" or (value and all(isinstance(v, dict) for v in value)):
        ok = any(_objects_ok(value, a) for a in answers if isinstance(a, list))
    else:
        ok = [_std(v) for v in value] in [[_std(v) for v in a] for a in answers if isinstance(a, list)]
    return None if ok else f"{arg!r}: {value!r} is not one of {answers!r}"


def _items_typed(value: list, kind: str | None, answers: list) -> bool:
    """Rule 4 one level down: against one of the acceptable lists, every item has the ``items`` type or the type of
    that list's first item (BFCL's "variable" case, as at the top level)."""
    lists = [a for a in answers if isinstance(a, list)] or [[]]
    return any(all(typed(v, kind) or (a and type(v) is type(a[0])) for v in value) for a in lists)


def _object_ok(value: dict, acceptable: dict) -> bool:
    """An object against ``{key: [acceptable values]}`` (BFCL's dict rule, one level)."""
    for key, item in value.items():
        if key not in acceptable or _std(item) not in [_std(a) for a in acceptable[key]]:
            return False
    return all(key in value or OMITTED in values for key, values in acceptable.items())


def _objects_ok(value: list, acceptable: list) -> bool:
    return len(value) == len(acceptable) and all(isinstance(v, dict) and isinstance(a, dict) and _object_ok(v, a)
                                                 for v, a in zip(value, acceptable))


def call_mismatch(call: Call, expected: dict, function: dict) -> str | None:
    """Why ``call`` is not ``expected`` (rules 2-5; ``function`` is the expected tool's schema), or None."""
    name, arguments = call
    if name != expected["name"]:
        return f"called {name!r}, expected {expected['name']!r}"
    parameters = function["parameters"]
    for arg in parameters["required"]:
        if arg not in arguments:
            return f"{name}: the required argument {arg!r} is missing"
    for arg, value in arguments.items():
        if arg not in parameters["properties"] or arg not in expected["arguments"]:
            return f"{name}: unexpected argument {arg!r}"
        why = argument_mismatch(arg, value, expected["arguments"][arg], parameters["properties"][arg])
        if why:
            return f"{name}: {why}"
    for arg, acceptable in expected["arguments"].items():
        if arg not in arguments and OMITTED not in acceptable:
            return f"{name}: the argument {arg!r} is missing"
    return None


def matched(calls: list[Call], expected: list[dict], functions: dict[str, dict], parallel: bool) -> int:
    """How many expected calls are matched: position by position, or (``parallel``) by a maximum matching of
    expected calls to distinct calls (augmenting paths)."""
    fits = [[call_mismatch(c, e, functions[e["name"]]) is None for c in calls] for e in expected]
    if not parallel:
        return sum(fits[i][i] for i in range(min(len(calls), len(expected))))
    owner: dict[int, int] = {}  # call index -> the expected call it is matched with

    def place(e: int, seen: set[int]) -> bool:
        for c, fit in enumerate(fits[e]):
            if fit and c not in seen:
                seen.add(c)
                if c not in owner or place(owner[c], seen):
                    owner[c] = e
                    return True
        return False

    return sum(place(e, set()) for e in range(len(expected)))


def function_call_score(completion: str, answer, tools, *, parallel: bool = False, partial: bool = False) -> float:
    """1.0 when the completion's calls match the expected ones by the module's rules, else 0.0 (``partial``: the
    share matched, over the larger count). ``answer`` and ``tools`` in any layout
    :mod:`grpoplus.rewards.tool_schemas` reads.

    >>> tools = [{"name": "area", "parameters": {"type": "object", "required": ["base"],
    ...           "properties": {"base": {"type": "number"}, "unit": {"type": "string", "default": "cm"}}}}]
    >>> function_call_score('<tool_call>{"name": "area", "arguments": {"base": 10}}</tool_call>',
    ...                     [{"name": "area", "arguments": {"base": 10.0}}], tools)
    1.0
    >>> function_call_score('{"name": "area", "arguments": {"base": 10, "unit": "CM"}}',
    ...                     [{"area": {"base": [10], "unit": ["cm", ""]}}], tools)
    1.0
    >>> function_call_score('{"name": "area", "arguments": {"base": 10, "colour": "red"}}',
    ...                     [{"name": "area", "arguments": {"base": 10}}], tools)
    0.0
    """
    schemas = read_tools(tools)
    expected = read_expected(answer, schemas)
    found = calls_in(completion)
    if found.invalid:
        count_event("calls/invalid")
        return 0.0
    if not found.calls:
        count_event("calls/none")
        return 0.0
    functions = {t["function"]["name"]: t["function"] for t in schemas}
    hits = matched(found.calls, expected, functions, parallel)
    if partial:
        return hits / max(len(found.calls), len(expected))
    return float(hits == len(expected) == len(found.calls))


@REWARDS.register("function_call")
def function_call_reward(prompts: list[str], completions: list[str], *, answer: list, tools: list | None = None,
                         parallel: list | None = None, partial: bool = False, **fields) -> list[float | None]:
    """1.0 when the completion's tool call(s) match the row's expected calls (name, arguments by value, BFCL's
    rules), else 0.0; ``partial=true``: the share of calls matched. Needs the row's ``tools``; ``parallel`` (a
    row field, or a parameter for every row) makes the calls' order free. None for a row without tools. Nothing is executed."""
    if parallel is None or isinstance(parallel, bool):  # no such field, or one setting for every row
        parallel = [bool(parallel)] * len(completions)
    tools = tools if tools is not None else [None] * len(completions)
    return [None if t is None else function_call_score(c, a, t, parallel=bool(p), partial=partial)
            for c, a, t, p in zip(completions, answer, tools, parallel, strict=True)]
