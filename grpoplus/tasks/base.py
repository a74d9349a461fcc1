"""The task contract: prompts, reference answers and a verifier.

A task is a registered object. The trainer only ever uses this interface, so a
synthetic task and a JSONL data set go through the same path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from grpoplus.core.registry import Registry


@dataclass(frozen=True)
class Example:
    """One prompt with its reference answer.

    ``fields`` holds any extra columns; they are passed to reward functions as keyword
    lists (``reward(prompts, completions, answer=[...], **fields)``).
    """

    prompt: str
    answer: str
    fields: dict = field(default_factory=dict)
    origin: str = ""  # where it was read (a data file's line), named by messages about it; "" for a generated one
    images: tuple = ()  # a vision-language policy's prompt images (grpoplus.data.images sources), shown in the prompt


class Task(Protocol):
    """What the trainer needs from a task."""

    name: str

    def split(self, name: str) -> Sequence[Example]:
        """The examples of ``"train"`` or ``"test"`` (held out)."""

    def reward(self, prompts: list[str], completions: list[str], answer: list[str], **fields) -> list[float]:
        """Verifier: 1.0 for a correct completion, 0.0 otherwise (fractions allowed, e.g. tests passed)."""


def reward_fields(examples: Sequence[Example]) -> dict[str, list]:
    """Per-sample keyword lists for a reward call: ``answer`` and every extra field of the examples."""
    fields = {"answer": [ex.answer for ex in examples]}
    for key in examples[0].fields if examples else ():
        fields[key] = [ex.fields.get(key) for ex in examples]
    return fields


def without_prompts(examples: Sequence[Example], held_out: Sequence[Example]) -> list[Example]:
    """The ``examples`` whose problem is not one of ``held_out``'s (:func:`problem_key`): a training split that never
    contains a held-out problem, also when the two splits were drawn with different seeds."""
    seen = {problem_key(ex) for ex in held_out}
    return [ex for ex in examples if problem_key(ex) not in seen]


def problem_key(example: Example) -> str:
    """What identifies a problem: its prompt, or ``fields["problem_id"]`` for a task whose prompt does not (a game
    with a hidden secret)."""
    return example.fields.get("problem_id", example.prompt)


def is_correct(score: float | None) -> bool:
    """A verifier's verdict: full marks (1.0, e.g. every test passed) counts as correct."""
    return (score or 0.0) >= 1.0


# name -> factory(**kwargs) -> Task
TASKS: Registry = Registry("task", builtins=("grpoplus.envs.guess",))  # the multi-turn guess task
