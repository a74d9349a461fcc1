"""Shared machinery of the built-in synthetic tasks: deterministic disjoint splits.

A synthetic task draws problems from a seeded generator. The held-out split is drawn
first, so it depends only on ``(difficulty, seed, n_test)``, never on ``n_train``; the
train split then skips every prompt already in the held-out split, so the two are disjoint.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import Callable, Sequence

from grpoplus.tasks.base import Example

SPLITS = ("train", "test")


@dataclass(frozen=True)
class SyntheticTask:
    """A built-in task: two splits, a verifier and the reference response of each example.

    Satisfies the :class:`grpoplus.tasks.base.Task` protocol. ``sft_target`` is only on the
    built-in tasks: the warm start trains on ``prompt + sft_target(example)``.
    """

    name: str
    difficulty: int
    train: tuple[Example, ...]
    test: tuple[Example, ...]
    verifier: Callable[..., list[float]]
    target_fn: Callable[[Example], str]
    chat: bool = False  # prompts are user messages: the trainer applies the model's chat template

    def split(self, name: str) -> Sequence[Example]:
        if name not in SPLITS:
            raise ValueError(f"unknown split {name!r} of task {self.name!r}; choose one of: {', '.join(SPLITS)}")
        return self.train if name == "train" else self.test

    def reward(self, prompts: list[str], completions: list[str], answer: list[str], **fields) -> list[float]:
        return self.verifier(prompts, completions, answer, **fields)

    def sft_target(self, example: Example) -> str:
        """The reference response text (without EOS) for ``example``."""
        return self.target_fn(example)


def draw_splits(
    draw: Callable[[random.Random], Example], *, seed: int, n_train: int, n_test: int, what: str
) -> tuple[tuple[Example, ...], tuple[Example, ...]]:
    """Draw ``n_test`` then ``n_train`` examples with unique prompts from ``draw(rng)``.

    Raises ``ValueError`` when the problem space is too small for that many unique prompts.
    """
    check_sizes(what, n_train, n_test)
    rng = random.Random(seed)
    seen: set[str] = set()
    splits = []
    for size in (n_test, n_train):
        examples: list[Example] = []
        misses = 0
        while len(examples) < size:
            example = draw(rng)
            if example.prompt in seen:
                misses += 1
                if misses > 20 * size + 1000:
                    raise ValueError(
                        f"{what}: could not draw {n_test + n_train} distinct problems; "
                        f"lower n_train/n_test or raise the difficulty"
                    )
                continue
            seen.add(example.prompt)
            examples.append(example)
        splits.append(tuple(examples))
    test, train = splits
    return train, test


def check_sizes(what: str, n_train: int | None, n_test: int | None) -> None:
    """Refuse negative split sizes (``data.task_kwargs``' n_train, n_test; None: not given): for :func:`draw_splits`
    and a factory's ``check_args``."""
    bad = [f"{name}={n}" for name, n in (("n_train", n_train), ("n_test", n_test)) if n is not None and n < 0]
    if bad:
        raise ValueError(f"{what}: n_train and n_test must be >= 0, got {', '.join(bad)}")


def check_int(name: str, value: object, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``, else ``ValueError`` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be an integer in [{low}, {high}], got {value!r}")
    return value


def difficulty_levels(task: str, low: int, high: int) -> Callable[..., None]:
    """A synthetic task factory's ``check_args``: its ``difficulty``, when given, is an integer in ``[low, high]`` and
    its split sizes (``n_train``, ``n_test``) are not negative. The factory asks it, and so do
    :func:`grpoplus.tasks.check_task_args` (``get_task``) and the config rule ``task``, before anything is built."""
    def check_args(difficulty: int | None = None, n_train: int | None = None, n_test: int | None = None, **_) -> None:
        if difficulty is not None:
            check_int(f"{task} difficulty", difficulty, low, high)
        check_sizes(task, n_train, n_test)

    return check_args


def final_answer(completion: object) -> str | None:
    """The text after the last ``#`` of a completion, stripped; ``None`` when there is none."""
    if not isinstance(completion, str) or "#" not in completion:
        return None
    return completion.rpartition("#")[2].strip()


def with_chat_template(task: SyntheticTask, tokenizer, model_name: str) -> SyntheticTask:
    """``task`` with every prompt (a user message) put through the tokenizer's chat template.

    Raises ``ValueError`` when the tokenizer has none (a base model or the built-in tiny model).
    """
    from grpoplus.data import apply_chat_template
    from grpoplus.data.images import image_messages
    from grpoplus.models.vision import processor_of

    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"task {task.name!r} writes its prompts as chat messages, but the tokenizer of model "
                         f"{model_name!r} has no chat template: use an instruct model (e.g. --model smollm2), or "
                         "data.chat_template=false to give it the raw prompts")

    def chat(example: Example) -> Example:
        if example.images:  # shown before the text, through the processor's template where the model has one
            shown = image_messages(example.prompt, len(example.images))
            return dataclasses.replace(example, prompt=apply_chat_template(processor_of(tokenizer) or tokenizer, shown))
        return dataclasses.replace(example, prompt=apply_chat_template(tokenizer, example.prompt))

    return dataclasses.replace(task, train=tuple(map(chat, task.train)), test=tuple(map(chat, task.test)),
                               chat=False)
