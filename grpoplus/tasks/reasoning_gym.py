"""``reasoning_gym``: reasoning-gym's procedural data sets as a single-turn task, scored by reasoning-gym itself.

``get_task("reasoning_gym", dataset="chain_sum", seed=0)``: ``dataset`` is a reasoning-gym data set (``chain_sum``,
``basic_arithmetic``, ``countdown``, ... : ``reasoning_gym.factory.DATASETS``). The training split is the data set's
first ``size`` problems of ``seed``, the held-out split its first ``test_size`` problems of ``seed + 1_000_003``
(reasoning-gym draws problem ``i`` of seed ``s`` from ``Random(s + i)``, so the offset keeps the two seed ranges
apart), less any training problem whose question is a held-out one. The prompts are reasoning-gym's questions, as
user messages (the trainer applies the model's chat template); the reference answers are its answers (``""`` for a
data set that has none and scores from the problem's metadata: boxnet, graph_color, ...).

The verifier is the data set's own ``score_answer`` (1.0 correct; some data sets give partial credit) on the
completion's final answer (:func:`final_answer`), with each problem's reasoning-gym metadata kept in the example's
``rg_metadata`` field to rebuild the entry it scores against.

``difficulty`` d (optional) is reasoning-gym's curriculum: every attribute of the data set's curriculum at level
``min(d, its top level)``, ranges spanning levels 0..d (reasoning-gym's default), 0 the easiest; None is the data
set's default configuration. A data set without a curriculum (acre, composite, gsm_symbolic, list_functions) takes
no difficulty. reasoning-gym is imported on first use (it takes a second).
"""

from __future__ import annotations

import functools
import importlib.util
import re
from typing import Any

from grpoplus.tasks.base import TASKS, Example
from grpoplus.tasks.synthetic import SyntheticTask

TEST_SEED_OFFSET = 1_000_003  # the held-out split's seed is seed + this
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)


def final_answer(completion: str) -> str:
    """The completion's final answer, stripped: the content of its last ``<answer>...</answer>``; else the text after
    its last ``<answer>`` (an unclosed tag) or last ``answer:`` (any case); else the whole completion."""
    tagged = _ANSWER_TAG.findall(completion)
    if tagged:
        return tagged[-1].strip()
    lowered = completion.lower()
    for marker in ("<answer>", "answer:"):
        at = lowered.rfind(marker)
        if at >= 0:
            return completion[at + len(marker):].strip()
    return completion.strip()


@TASKS.register("reasoning_gym")
def reasoning_gym_task(dataset: str | None = None, seed: int = 0, size: int = 2000, difficulty: int | None = None,
                       test_size: int = 200) -> SyntheticTask:
    """The reasoning-gym data set ``dataset`` as a task (see the module docstring; the argument is not ``name``:
    ``get_task(name, **kwargs)`` takes that one itself)."""
    check_args(dataset=dataset, size=size, difficulty=difficulty, test_size=test_size)
    test = tuple(_examples(dataset, seed + TEST_SEED_OFFSET, test_size, difficulty))
    held_out = {ex.prompt for ex in test}
    train = tuple(ex for ex in _examples(dataset, seed, size, difficulty) if ex.prompt not in held_out)
    verifier = functools.partial(reasoning_gym_reward, rg_dataset=dataset, rg_difficulty=difficulty)
    return SyntheticTask(f"reasoning_gym/{dataset}", difficulty, train, test, verifier, _target,
                         chat=reasoning_gym_task.chat)


def check_args(dataset: str | None = None, size: int = 0, difficulty: int | None = None, test_size: int = 0,
               **_) -> None:
    """Refuse, before anything is built, what the task would: no data set, an unknown one, negative sizes, a
    difficulty a data set has no curriculum level for (the factory asks it, and so do ``get_task`` and the config
    rule ``task``; it imports reasoning-gym)."""
    if not dataset:
        raise ValueError("task reasoning_gym needs the reasoning-gym data set: get_task('reasoning_gym', "
                         "dataset='chain_sum') (names: reasoning_gym.factory.DATASETS)")
    if size < 0 or test_size < 0:
        raise ValueError(f"task reasoning_gym: size and test_size must be >= 0, got {size} and {test_size}")
    _check_dataset(dataset, difficulty)


reasoning_gym_task.check_args = check_args
reasoning_gym_task.chat = True  # its prompts are user messages (SyntheticTask.chat), known before it is built


def reasoning_gym_reward(prompts: list[str], completions: list[str], answer: list[str],
                         rg_metadata: list[dict] | None = None, *, rg_dataset: str, rg_difficulty: int | None = None,
                         **fields) -> list[float]:
    """reasoning-gym's ``score_answer`` of each completion's :func:`final_answer` against the entry rebuilt from its
    reference answer and ``rg_metadata`` (the question is not part of it: no data set scores from it)."""
    if rg_metadata is None:
        raise ValueError("reasoning_gym reward needs the 'rg_metadata' field of each example (pass **example.fields)")
    if not len(completions) == len(answer) == len(rg_metadata):
        raise ValueError(f"reasoning_gym reward: {len(completions)} completions, {len(answer)} answers, "
                         f"{len(rg_metadata)} metadata")
    scorer = _dataset(rg_dataset, 0, 1, rg_difficulty)
    return [float(scorer.score_answer(answer=final_answer(c), entry={"answer": a or None, "metadata": m}))
            for c, a, m in zip(completions, answer, rg_metadata)]


def _examples(name: str, seed: int, size: int, difficulty: int | None) -> list[Example]:
    """The first ``size`` problems of the data set at ``seed`` as examples."""
    dataset = _dataset(name, seed, size, difficulty)
    return [Example(e["question"], "" if e["answer"] is None else str(e["answer"]), {"rg_metadata": e["metadata"]})
            for e in (dataset[i] for i in range(size))]


@functools.lru_cache(maxsize=16)
def _dataset(name: str, seed: int, size: int, difficulty: int | None) -> Any:
    """reasoning-gym's data set ``name`` (its default configuration, or its curriculum at ``difficulty``); cached, as
    the verifier asks for its scorer on every call."""
    _check_dataset(name, difficulty)
    from reasoning_gym.factory import DATASETS, create_curriculum, create_dataset

    if difficulty is None:
        return create_dataset(name, seed=seed, size=size)
    curriculum = create_curriculum(name)
    curriculum.set_global_level(difficulty)
    return DATASETS[name][0](config=curriculum.generate_configuration({"seed": seed, "size": size}))


def _check_dataset(name: str, difficulty: int | None) -> None:
    """reasoning-gym has the data set ``name``, with a curriculum level ``difficulty`` (None: its default)."""
    if importlib.util.find_spec("reasoning_gym") is None:
        raise ImportError("task reasoning_gym needs the reasoning-gym package: pip install 'grpoplus[envs]'")
    from reasoning_gym.factory import DATASETS, has_curriculum

    if name not in DATASETS:
        raise ValueError(f"task reasoning_gym: unknown data set {name!r}; choose one of: {', '.join(sorted(DATASETS))}")
    if difficulty is None:
        return
    if not has_curriculum(name):
        raise ValueError(f"task reasoning_gym: data set {name!r} has no curriculum, so no difficulty levels: leave "
                         "difficulty unset")
    if difficulty < 0:
        raise ValueError(f"task reasoning_gym: difficulty is a curriculum level >= 0, got {difficulty}")


def _target(example: Example) -> str:
    """The reference response: the answer in the tags :func:`final_answer` reads first."""
    return f"<answer>{example.answer}</answer>"
