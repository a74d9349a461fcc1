"""``wordproblems``: GSM8K-style word problems with integer answers, for chat models.

A problem is a short story of ``difficulty`` arithmetic steps (1..4) in one of four
settings (shopping, a bakery's hourly output, sharing equally, ages), with small numbers
so that a small instruct model solves some of them. The prompt is the user message of a
chat (the trainer applies the model's chat template) and asks for the GSM8K answer line::

    Mia has 12 dollars. Mia earns 5 dollars doing chores. Then Mia buys a book for 9
    dollars. How many dollars does Mia have now?
    Give the final answer on the last line as '#### <number>'.

The verifier is the math reward: the answer after the last ``####`` (or in ``\\boxed{}``)
must equal the reference; the ``gsm8k_format`` reward scores the answer line alone, so a
run shows the format being learned before the arithmetic.
"""

from __future__ import annotations

import random

from grpoplus.tasks.base import TASKS, Example
from grpoplus.tasks.synthetic import SyntheticTask, difficulty_levels, draw_splits

INSTRUCTION = "Give the final answer on the last line as '#### <number>'."
NAMES = ("Mia", "Tom", "Sara", "Ali", "Mei", "Ravi", "Lena", "Omar", "Zoe", "Ben")
MAX_VALUE = 200

Story = tuple[list[str], list[str], int, str]
"""(sentences, worked lines, answer, question) of one problem."""


def _shopping(rng: random.Random, name: str, steps: int) -> Story | None:
    value = rng.randint(5, 15)
    sentences, lines = [f"{name} has {value} dollars."], []
    for _ in range(steps):
        kind = rng.choice(("earn", "book", "pens"))
        if kind == "earn":
            y = rng.randint(2, 6)
            sentences.append(f"{name} earns {y} dollars doing chores.")
            lines.append(f"{value} + {y} = {value + y}")
            value += y
        elif kind == "book":
            y = rng.randint(1, 6)
            sentences.append(f"Then {name} buys a book for {y} dollars.")
            lines.append(f"{value} - {y} = {value - y}")
            value -= y
        else:
            k, price = rng.randint(2, 4), rng.randint(1, 3)
            sentences.append(f"{name} buys {k} pens at {price} dollars each.")
            lines.append(f"{k} * {price} = {k * price}\n{value} - {k * price} = {value - k * price}")
            value -= k * price
        if value < 1:  # every intermediate amount stays positive
            return None
    return sentences, lines, value, f"How many dollars does {name} have now?"


def _bakery(rng: random.Random, name: str, steps: int) -> Story | None:
    rate, hours = rng.randint(2, 5), rng.randint(2, 3)
    value = rate * hours
    sentences = [f"{name}'s bakery bakes {rate} loaves every hour for {hours} hours."]
    lines = [f"{rate} * {hours} = {value}"]
    for _ in range(steps - 1):
        y = rng.randint(2, 6)
        if rng.random() < 0.5:
            sentences.append(f"{name} bakes {y} more loaves.")
            lines.append(f"{value} + {y} = {value + y}")
            value += y
        else:
            sentences.append(f"{name} sells {y} loaves.")
            lines.append(f"{value} - {y} = {value - y}")
            value -= y
        if value < 1:
            return None
    return sentences, lines, value, f"How many loaves does {name} have now?"


def _sharing(rng: random.Random, name: str, steps: int) -> Story | None:
    value = rng.randint(4, 15)
    sentences, lines = [f"{name} picks {value} apples."], []
    for _ in range(steps - 1):
        y = rng.randint(1, 5)
        if rng.random() < 0.5:
            sentences.append(f"{name} finds {y} more apples.")
            lines.append(f"{value} + {y} = {value + y}")
            value += y
        else:
            sentences.append(f"{name} eats {y} of them.")
            lines.append(f"{value} - {y} = {value - y}")
            value -= y
        if value < 1:
            return None
    friends = [k for k in range(2, 6) if value % k == 0]
    if not friends:
        return None
    k = rng.choice(friends)
    sentences.append(f"{name} shares the apples equally among {k} friends.")
    lines.append(f"{value} / {k} = {value // k}")
    return sentences, lines, value // k, "How many apples does each friend get?"


def _ages(rng: random.Random, name: str, steps: int) -> Story | None:
    people = [name] + rng.sample([n for n in NAMES if n != name], steps)
    value = rng.randint(3, 12)
    sentences, lines = [f"{name} is {value} years old."], []
    for before, after in zip(people, people[1:]):
        kind = rng.choice(("older", "younger", "twice"))
        if kind == "twice":
            sentences.append(f"{after} is twice as old as {before}.")
            lines.append(f"{value} * 2 = {value * 2}")
            value *= 2
        else:
            y = rng.randint(2, 5)
            sign = 1 if kind == "older" else -1
            sentences.append(f"{after} is {y} years {kind} than {before}.")
            lines.append(f"{value} {'+' if sign > 0 else '-'} {y} = {value + sign * y}")
            value += sign * y
        if value < 1:
            return None
    return sentences, lines, value, f"How old is {people[-1]}?"


SETTINGS = {"shopping": _shopping, "bakery": _bakery, "sharing": _sharing, "ages": _ages}


def draw_wordproblem(rng: random.Random, steps: int) -> Example:
    """A problem of ``steps`` arithmetic steps in a random setting; the answer is an integer in [1, MAX_VALUE]."""
    while True:
        story = SETTINGS[rng.choice(sorted(SETTINGS))](rng, rng.choice(NAMES), steps)
        if story is not None and 1 <= story[2] <= MAX_VALUE:
            sentences, lines, value, question = story
            return Example(prompt=" ".join(sentences + [question]) + "\n" + INSTRUCTION, answer=str(value),
                           fields={"solution": "\n".join(lines)})


def wordproblem_target(example: Example) -> str:
    """The worked solution: one line per step, then the GSM8K answer line."""
    return f"{example.fields['solution']}\n#### {example.answer}"


def wordproblem_reward(prompts: list[str], completions: list[str], answer: list[str], **fields) -> list[float]:
    """1.0 when the final answer (after the last ``####``, or in ``\\boxed{}``) equals the reference.

    >>> wordproblem_reward(["p"] * 3, ["12 + 5 = 17\\n#### 17", "#### 16", "17"], ["17"] * 3)
    [1.0, 0.0, 0.0]
    """
    from grpoplus.rewards import math_reward

    if len(completions) != len(answer):
        raise ValueError(f"wordproblems reward: {len(completions)} completions but {len(answer)} answers")
    return [math_reward(c, a) for c, a in zip(completions, answer)]


@TASKS.register("wordproblems")
def wordproblems(difficulty: int = 2, seed: int = 0, n_train: int = 5000, n_test: int = 200) -> SyntheticTask:
    """The word-problem task: ``difficulty`` (1..4) arithmetic steps per problem; chat prompts."""
    wordproblems.check_args(difficulty=difficulty)
    train, test = draw_splits(lambda rng: draw_wordproblem(rng, difficulty), seed=seed, n_train=n_train,
                              n_test=n_test, what="wordproblems")
    return SyntheticTask("wordproblems", difficulty, train, test, wordproblem_reward, wordproblem_target,
                         chat=wordproblems.chat)


wordproblems.check_args = difficulty_levels("wordproblems", 1, 4)
wordproblems.chat = True  # its prompts are user messages (SyntheticTask.chat), known before it is built
