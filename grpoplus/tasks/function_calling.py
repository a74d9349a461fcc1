"""``function_calling``: requests answered by calling one of a few built-in tools, scored by the ``function_call``
reward (BFCL's rules, nothing executed).

Four tools (``weather``, ``convert``, ``calc``, ``timer``); each problem is a row in the function-calling layout
(:mod:`grpoplus.data.functions`: tools, messages, expected calls, ``parallel``, mock ``tool_results`` for the
multi-turn environment). The prompt, written for the built-in character model, lists the tools it offers in one
line and asks; the reference response states the call(s) in the stated format::

    prompt   "tools: timer(minutes,label?) weather(city,unit?)\\nweather in Oslo in fahrenheit?\\n"
    response '<tool_call>{"name":"weather","arguments":{"city":"Oslo","unit":"f"}}</tool_call>'

``difficulty`` (1..4) is how many tools a prompt offers (the one it needs and ``difficulty - 1`` others); from 3 on,
half the weather requests ask for two cities at once (two calls in any order: ``parallel``). A call runs to about
70 to 90 characters: unless given, ``rollout.max_new_tokens`` is raised to 128 for this task (a whole call then
ends before DAPO's soft overlong punishment starts; 200 fits the two-call requests of difficulty 3 and 4). A chat
model reads the full schemas through its chat template when the rows are a data set: ``python -m
grpoplus.tasks.function_calling_rows rows.jsonl`` writes them, ``grpoplus train --data rows.jsonl`` trains on them.
"""

from __future__ import annotations

import json
import random

from grpoplus.data.functions import function_call_record
from grpoplus.rewards.function_call import function_call_reward
from grpoplus.tasks.base import TASKS, Example
from grpoplus.tasks.synthetic import SyntheticTask, difficulty_levels, draw_splits


def _tool(name: str, description: str, properties: dict, required: list[str]) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


TOOLS = {
    "weather": _tool("weather", "Current weather in a city", {
        "city": {"type": "string", "description": "the city's name"},
        "unit": {"type": "string", "enum": ["c", "f"], "default": "c", "description": "c (celsius) or f (fahrenheit)"},
    }, ["city"]),
    "convert": _tool("convert", "Convert a quantity from one unit to another", {
        "value": {"type": "number", "description": "the quantity"},
        "src": {"type": "string", "description": "its unit: km, mi, kg or lb"},
        "dst": {"type": "string", "description": "the unit wanted"},
    }, ["value", "src", "dst"]),
    "calc": _tool("calc", "Evaluate an arithmetic expression", {
        "expr": {"type": "string", "description": "numbers with + - * and parentheses"},
    }, ["expr"]),
    "timer": _tool("timer", "Start a countdown timer", {
        "minutes": {"type": "integer", "description": "how long"},
        "label": {"type": "string", "description": "a name for it"},
    }, ["minutes"]),
}
CITIES = ("Oslo", "Lima", "Rome", "Paris", "Tokyo", "Cairo", "Delhi", "Quito", "Seoul", "Dakar", "Perth", "Riga",
          "Accra", "Baku", "Hanoi", "Kyiv", "Lagos", "Minsk", "Nice", "Sofia")
LABELS = ("tea", "eggs", "pasta", "nap", "run", "bread", "rice", "study")
FACTORS = {("km", "mi"): 0.621, ("mi", "km"): 1.609, ("kg", "lb"): 2.205, ("lb", "kg"): 0.454}


def _call(name: str, **arguments) -> dict:
    return {"name": name, "arguments": arguments}


def _weather(rng: random.Random) -> tuple[str, list[dict], list[dict]]:
    city, unit = rng.choice(CITIES), rng.choice((None, "c", "f"))
    asked = {None: "", "c": " in celsius", "f": " in fahrenheit"}[unit]
    call = _call("weather", city=city, **({} if unit is None else {"unit": unit}))
    degrees = rng.randint(-5, 35)
    shown = f"{degrees} C" if unit != "f" else f"{round(degrees * 9 / 5 + 32)} F"
    return f"weather in {city}{asked}?", [call], [dict(call, result=f"{shown}, {rng.choice(('sunny', 'rain'))}")]


def _two_cities(rng: random.Random) -> tuple[str, list[dict], list[dict]]:
    first, second = rng.sample(CITIES, 2)
    calls = [_call("weather", city=first), _call("weather", city=second)]
    return (f"weather in {first} and in {second}?", calls,
            [dict(c, result=f"{rng.randint(-5, 35)} C, sunny") for c in calls])


def _convert(rng: random.Random) -> tuple[str, list[dict], list[dict]]:
    (src, dst), value = rng.choice(sorted(FACTORS)), rng.randint(1, 199)
    call = _call("convert", value=value, src=src, dst=dst)
    return f"convert {value} {src} to {dst}", [call], [dict(call, result=f"{value * FACTORS[src, dst]:.1f} {dst}")]


def _calc(rng: random.Random) -> tuple[str, list[dict], list[dict]]:
    a, b, c = (rng.randint(2, 9) for _ in range(3))
    op = rng.choice("+-")
    expr = f"{a}*{b}{op}{c}"
    call = _call("calc", expr=expr)
    return f"what is {expr}?", [call], [dict(call, result=str(a * b + c if op == "+" else a * b - c))]


def _timer(rng: random.Random) -> tuple[str, list[dict], list[dict]]:
    minutes, label = rng.randint(1, 90), rng.choice((None, *LABELS))
    call = _call("timer", minutes=minutes, **({} if label is None else {"label": label}))
    named = "" if label is None else f" named {label}"
    return f"timer for {minutes} minutes{named}", [call], [dict(call, result="timer started")]


REQUESTS = {"weather": _weather, "convert": _convert, "calc": _calc, "timer": _timer}


def tools_line(tools: list[dict]) -> str:
    """The tools in one line, each ``name(argument,optional?)``: what the character model reads.

    >>> tools_line([TOOLS["weather"]])
    'tools: weather(city,unit?)'
    """
    def signature(function: dict) -> str:
        p = function["parameters"]
        args = [a if a in p["required"] else f"{a}?" for a in p["properties"]]
        return f"{function['name']}({','.join(args)})"

    return "tools: " + " ".join(signature(t["function"]) for t in tools)


def draw_row(rng: random.Random, difficulty: int) -> dict:
    """One problem as a row of the function-calling layout (with the character model's ``prompt`` beside)."""
    needed = rng.choice(sorted(REQUESTS))
    parallel = difficulty >= 3 and needed == "weather" and rng.random() < 0.5
    question, calls, results = (_two_cities if parallel else REQUESTS[needed])(rng)
    offered = [needed] + rng.sample([t for t in sorted(TOOLS) if t != needed], difficulty - 1)
    rng.shuffle(offered)
    tools = [TOOLS[t] for t in offered]
    return {"prompt": f"{tools_line(tools)}\n{question}\n", "messages": [{"role": "user", "content": question}],
            "tools": tools, "answer": calls, "parallel": parallel, "tool_results": results}


def draw_function_call(rng: random.Random, difficulty: int) -> Example:
    row = draw_row(rng, difficulty)
    record = function_call_record({k: v for k, v in row.items() if k != "prompt"})
    fields = {k: v for k, v in record["fields"].items() if k != "messages"}  # the prompt is the character model's
    return Example(row["prompt"], record["answer"], dict(fields, calls=row["answer"]))


def function_call_target(example: Example) -> str:
    """The reference response: each expected call in the stated format, compact JSON."""
    return "".join(f"<tool_call>{json.dumps(call, separators=(',', ':'))}</tool_call>"
                   for call in example.fields["calls"])


def function_calling_reward(prompts, completions, answer, **fields) -> list[float | None]:
    """The ``function_call`` reward with the rows' tools and ``parallel``."""
    return function_call_reward(prompts, completions, answer=answer, tools=fields.get("tools"),
                                parallel=fields.get("parallel"))


@TASKS.register("function_calling")
def function_calling(difficulty: int = 2, seed: int = 0, n_train: int = 1500, n_test: int = 100) -> SyntheticTask:
    """Calling the right built-in tool with the right arguments: ``difficulty`` (1..4) tools offered per prompt,
    two-call parallel requests from 3 on."""
    function_calling.check_args(difficulty=difficulty)
    train, test = draw_splits(lambda rng: draw_function_call(rng, difficulty), seed=seed, n_train=n_train,
                              n_test=n_test, what="function_calling")
    return SyntheticTask("function_calling", difficulty, train, test, function_calling_reward, function_call_target)


function_calling.check_args = difficulty_levels("function_calling", 1, 4)


# the built-in model's warm start (grpoplus.sft.warmstart): sequences about 5x arithmetic's, so smaller supervised steps
# (about 3.5 minutes on two idle CPU cores); it starts at 4% greedy accuracy on the held-out split (pass@4 6%)
function_calling.sft_steps = 600
function_calling.sft_batch_size = 32
# a call runs to about 90 characters; rollout.max_new_tokens when not given, so that DAPO's soft overlong punishment
# (from 3/4 of it) leaves a whole call alone
function_calling.response_tokens = 128
