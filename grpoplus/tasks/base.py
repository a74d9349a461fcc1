"""The task contract: prompts, reference answers and a verifier.

A task is a registered object. The trainer only ever uses this interface, so a
synthetic task and a JSONL data set go through the same path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from grpoplus.registry import Registry


@dataclass(frozen=True)
class Example:
    """One prompt with its reference answer.

    ``fields`` holds any extra columns; they are passed to reward functions as keyword
    lists (``reward(prompts, completions, answer=[...], **fields)``).
    """

    prompt: str
    answer: str
    fields: dict = field(default_factory=dict)


class Task(Protocol):
    """What the trainer needs from a task."""

    name: str

    def split(self, name: str) -> Sequence[Example]:
        """The examples of ``"train"`` or ``"test"`` (held out)."""

    def reward(self, prompts: list[str], completions: list[str], answer: list[str], **fields) -> list[float]:
        """Verifier: 1.0 for a correct completion, 0.0 otherwise (fractions allowed, e.g. tests passed)."""


# name -> factory(**kwargs) -> Task
TASKS: Registry = Registry("task")
