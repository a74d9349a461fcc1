"""``countdown``: reach a target from given numbers with + - * / (each number at most once).

Prompt and reference response (the response ends with EOS)::

    prompt   "3,7,25,50->96:"
    response "3*7=21,21+25=46,46+50=96#3*7+25+50"

The steps are scratch work; the verifier reads only the expression after the last ``#``
and evaluates it safely: parsed with :mod:`ast`, only integer literals, ``+ - * /`` and
parentheses allowed, each given number used at most once, exact rational arithmetic with
:class:`fractions.Fraction` (so ``7/2*2`` is 7), nothing is ever executed. ``difficulty``
is how many numbers are given (2..6); numbers are 1..25.
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from fractions import Fraction

from grpoplus.tasks.base import TASKS, Example
from grpoplus.tasks.synthetic import SyntheticTask, difficulty_levels, draw_splits, final_answer

MAX_NUMBER = 25
MAX_VALUE = 999
MAX_EXPRESSION_CHARS = 100
_ALLOWED_CHARS = re.compile(r"[0-9+\-*/() ]+")
_OPS = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__, ast.Mult: Fraction.__mul__, ast.Div: Fraction.__truediv__}


def _combine(rng: random.Random, value: int, x: int) -> tuple[str, int]:
    """A random operation on ``value`` and ``x`` whose result is an integer in [0, MAX_VALUE]."""
    # value <= MAX_VALUE and x <= MAX_NUMBER, so when "+" overflows "-" is available.
    choices = [("+", value + x)] if value + x <= MAX_VALUE else []
    if x <= value:
        choices.append(("-", value - x))
    if value * x <= MAX_VALUE:
        choices.append(("*", value * x))
    if x > 1 and value % x == 0:
        choices.append(("/", value // x))
    return rng.choice(choices)


def draw_countdown(rng: random.Random, difficulty: int) -> Example:
    """``difficulty`` numbers in [1, 25] and a target reached by combining all of them in a random order."""
    numbers = [rng.randint(1, MAX_NUMBER) for _ in range(difficulty)]
    value, ops = numbers[0], []
    for x in numbers[1:]:
        op, value = _combine(rng, value, x)
        ops.append(op)
    prompt = ",".join(str(n) for n in sorted(numbers)) + f"->{value}:"
    # The solution order is stored so the reference response can be rebuilt from the example.
    return Example(prompt=prompt, answer=str(value), fields={"numbers": sorted(numbers), "order": numbers, "ops": ops})


def countdown_target(example: Example) -> str:
    """The worked response: one step per operation, then ``#`` and the expression."""
    numbers, ops = example.fields["order"], example.fields["ops"]
    value, expression, last_op, steps = numbers[0], str(numbers[0]), None, []
    for op, x in zip(ops, numbers[1:]):
        # Left-deep chain: the left side needs parentheses only when * or / follows + or -.
        if op in "*/" and last_op in ("+", "-"):
            expression = f"({expression})"
        expression += f"{op}{x}"
        new = {"+": value + x, "-": value - x, "*": value * x, "/": value // max(x, 1)}[op]
        steps.append(f"{value}{op}{x}={new}")
        value, last_op = new, op
    return ",".join(steps) + f"#{expression}"


class _Rejected(Exception):
    """An expression that uses anything but integer literals, + - * / and parentheses."""


def _evaluate_node(node: ast.AST, used: list[int]) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate_node(node.left, used), _evaluate_node(node.right, used)
        return _OPS[type(node.op)](left, right)
    raise _Rejected(type(node).__name__)


def evaluate_expression(expression: str, numbers: list[int]) -> Fraction | None:
    """The exact value of ``expression``, or ``None`` when it is not a valid countdown answer.

    Invalid: too long, any character besides digits/``+-*/()``/space, a syntax error, any
    other operation (``**``, calls, names, unary minus), a number used more often than it
    is given, or a division by zero. Nothing is executed.

    >>> evaluate_expression("(25-3)*7/2", [2, 3, 7, 25])
    Fraction(77, 1)
    >>> evaluate_expression("25*25", [3, 25]) is None, evaluate_expression("__import__('os')", [1]) is None
    (True, True)
    """
    if len(expression) > MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.fullmatch(expression):
        return None
    try:
        tree = ast.parse(expression, mode="eval")
        used: list[int] = []
        value = _evaluate_node(tree.body, used)
    except (SyntaxError, ValueError, _Rejected, ZeroDivisionError):
        return None
    if Counter(used) - Counter(numbers):
        return None
    return value


def countdown_reward(
    prompts: list[str], completions: list[str], answer: list[str], numbers: list[list[int]] | None = None, **fields
) -> list[float]:
    """1.0 when the expression after the last ``#`` uses the given ``numbers`` and equals the target.

    ``numbers`` is the per-example field of the task (one list of ints per completion).

    >>> countdown_reward(["2,3,4->20:"] * 3, ["#(2+3)*4", "#2*3*4", "#4*5"], ["20"] * 3, numbers=[[2, 3, 4]] * 3)
    [1.0, 0.0, 0.0]
    """
    if numbers is None:
        raise ValueError("countdown reward needs the 'numbers' field of each example (pass **example.fields)")
    if not len(completions) == len(answer) == len(numbers):
        raise ValueError(
            f"countdown reward: {len(completions)} completions, {len(answer)} answers, {len(numbers)} number lists"
        )
    scores = []
    for completion, target, given in zip(completions, answer, numbers):
        expression = final_answer(completion)
        value = None if expression is None else evaluate_expression(expression, list(given))
        scores.append(1.0 if value is not None and str(value) == str(target).strip() else 0.0)
    return scores


@TASKS.register("countdown")
def countdown(difficulty: int = 3, seed: int = 0, n_train: int = 5000, n_test: int = 200) -> SyntheticTask:
    """The countdown task: ``difficulty`` (2..6) numbers are given."""
    countdown.check_args(difficulty=difficulty)
    train, test = draw_splits(
        lambda rng: draw_countdown(rng, difficulty), seed=seed, n_train=n_train, n_test=n_test, what="countdown"
    )
    return SyntheticTask("countdown", difficulty, train, test, countdown_reward, countdown_target)


countdown.check_args = difficulty_levels("countdown", 2, 6)
