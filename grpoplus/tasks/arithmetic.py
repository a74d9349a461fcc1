"""``arithmetic``: multi-step addition and subtraction, worked left to right.

Prompt and reference response (the response ends with EOS)::

    prompt   "23+45-17="
    response "23+45=68,68-17=51#51"

One step per operation, comma separated, then ``#`` and the final answer, which is what
the verifier reads. ``difficulty`` is the largest number of operations (each problem has
1..difficulty of them, so responses vary in length); operands are 0..99 and every
intermediate value stays >= 0, so no negative numbers appear.
"""

from __future__ import annotations

import random

from grpoplus.tasks.base import TASKS, Example
from grpoplus.tasks.synthetic import SyntheticTask, check_int, draw_splits, final_answer

MAX_OPERAND = 99


def draw_arithmetic(rng: random.Random, difficulty: int) -> Example:
    """One problem with 1..``difficulty`` operations on operands in [0, 99]."""
    n_ops = rng.randint(1, difficulty)
    operands = [rng.randint(0, MAX_OPERAND)]
    ops = []
    value = operands[0]
    for _ in range(n_ops):
        operand = rng.randint(0, MAX_OPERAND)
        # Subtract only when the running value stays >= 0, otherwise add.
        op = "-" if rng.random() < 0.5 and operand <= value else "+"
        value = value + operand if op == "+" else value - operand
        operands.append(operand)
        ops.append(op)
    prompt = str(operands[0]) + "".join(f"{op}{x}" for op, x in zip(ops, operands[1:])) + "="
    return Example(prompt=prompt, answer=str(value), fields={})


def arithmetic_target(example: Example) -> str:
    """The worked response: ``"a+b=c,c-d=e#e"`` (recomputed from the prompt)."""
    expression = example.prompt.rstrip("=")
    tokens = expression.replace("-", " - ").replace("+", " + ").split()
    value = int(tokens[0])
    steps = []
    for op, operand in zip(tokens[1::2], tokens[2::2]):
        new = value + int(operand) if op == "+" else value - int(operand)
        steps.append(f"{value}{op}{operand}={new}")
        value = new
    return ",".join(steps) + f"#{value}"


def arithmetic_reward(prompts: list[str], completions: list[str], answer: list[str], **fields) -> list[float]:
    """1.0 when the text after the last ``#`` is exactly the reference integer, else 0.0.

    Never raises on a malformed completion (it scores 0.0).

    >>> arithmetic_reward(["2+3="] * 3, ["2+3=5#5", "2+3=6#6", "no answer"], ["5"] * 3)
    [1.0, 0.0, 0.0]
    """
    if len(completions) != len(answer):
        raise ValueError(f"arithmetic reward: {len(completions)} completions but {len(answer)} answers")
    return [1.0 if final_answer(c) == str(a).strip() else 0.0 for c, a in zip(completions, answer)]


@TASKS.register("arithmetic")
def arithmetic(difficulty: int = 3, seed: int = 0, n_train: int = 5000, n_test: int = 200) -> SyntheticTask:
    """The arithmetic task: ``difficulty`` (1..8) is the largest number of operations per problem."""
    check_int("arithmetic difficulty", difficulty, 1, 8)
    train, test = draw_splits(
        lambda rng: draw_arithmetic(rng, difficulty), seed=seed, n_train=n_train, n_test=n_test, what="arithmetic"
    )
    return SyntheticTask("arithmetic", difficulty, train, test, arithmetic_reward, arithmetic_target)
