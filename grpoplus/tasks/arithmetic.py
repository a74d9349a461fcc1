"""``arithmetic``: chains of single-digit additions and subtractions, worked step by step.

Prompt and reference response (the response ends with EOS)::

    prompt   "9-6+1+8-2="
    response "3+1+8-2=4+8-2=12-2=10#10"

Each step does the leftmost operation and rewrites the rest of the expression (a
scratchpad a small model can follow), then ``#`` and the final answer, which is all the
verifier reads. ``difficulty`` is the largest number of operations: each problem has
1..difficulty of them, so responses vary in length. Operands are 0..9 and every running
value stays >= 0 (no negative numbers).
"""

from __future__ import annotations

import random

from grpoplus.tasks.base import TASKS, Example
from grpoplus.tasks.synthetic import SyntheticTask, difficulty_levels, draw_splits, final_answer

MAX_OPERAND = 9


def draw_arithmetic(rng: random.Random, difficulty: int) -> Example:
    """One problem with 1..``difficulty`` operations on operands in [0, 9]."""
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
    """The worked response: the expression rewritten after each operation, then ``#answer``.

    >>> arithmetic_target(Example("9-6+1+8=", "12"))
    '3+1+8=4+8=12#12'
    """
    tokens = example.prompt.rstrip("=").replace("-", " - ").replace("+", " + ").split()
    value, rest, lines = int(tokens[0]), tokens[1:], []
    while rest:
        op, operand, rest = rest[0], int(rest[1]), rest[2:]
        value = value + operand if op == "+" else value - operand
        lines.append(str(value) + "".join(rest))
    return "=".join(lines) + f"#{value}"


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
def arithmetic(difficulty: int = 4, seed: int = 0, n_train: int = 5000, n_test: int = 200) -> SyntheticTask:
    """The arithmetic task: ``difficulty`` (1..10) is the largest number of operations per problem.

    Difficulties 1 and 2 have fewer distinct problems than the default split sizes: pass a
    smaller ``n_train`` for them.
    """
    arithmetic.check_args(difficulty=difficulty)
    train, test = draw_splits(
        lambda rng: draw_arithmetic(rng, difficulty), seed=seed, n_train=n_train, n_test=n_test, what="arithmetic"
    )
    return SyntheticTask("arithmetic", difficulty, train, test, arithmetic_reward, arithmetic_target)


arithmetic.check_args = difficulty_levels("arithmetic", 1, 10)
