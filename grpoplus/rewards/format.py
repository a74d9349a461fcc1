"""Format rewards for the ``<think>...</think><answer>...</answer>`` layout (DeepSeek-R1).

Every tag must appear exactly once and in order, so repeating or nesting blocks earns
nothing; the strict form also fixes the newlines around the tags and forbids empty blocks.
"""

from __future__ import annotations

from grpoplus.rewards.registry import REWARDS

TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def tag_counts(completion: str) -> dict[str, int]:
    """How many times each of the four tags occurs."""
    return {tag: completion.count(tag) for tag in TAGS}


def format_ok(completion: str, *, strict: bool = False, think_in_prompt: bool = False) -> bool:
    r"""True when the completion is one think block followed by one answer block.

    Loose: optional whitespace around and between the blocks. Strict: exactly
    ``<think>\n...\n</think>\n<answer>\n...\n</answer>`` (one trailing newline allowed)
    with non-empty blocks. ``think_in_prompt``: the chat template already opened
    ``<think>``, so the completion must not repeat it.

    >>> format_ok("<think>a</think> <answer>1</answer>")
    True
    >>> format_ok("<think>a</think><answer>1</answer><answer>2</answer>")
    False
    >>> format_ok("<think>a<think>b</think></think><answer>1</answer>")
    False
    >>> format_ok("<think>a</think> <answer>1</answer>", strict=True)
    False
    >>> format_ok("<think>\na\n</think>\n<answer>\n1\n</answer>", strict=True)
    True
    """
    text = ("<think>" + completion) if think_in_prompt else completion
    counts = tag_counts(text)
    if any(n != 1 for n in counts.values()):
        return False
    positions = [text.index(tag) for tag in TAGS]
    if positions != sorted(positions):
        return False
    think = text[positions[0] + len(TAGS[0]) : positions[1]]
    between = text[positions[1] + len(TAGS[1]) : positions[2]]
    answer = text[positions[2] + len(TAGS[2]) : positions[3]]
    before, after = text[: positions[0]], text[positions[3] + len(TAGS[3]) :]
    if not strict:
        return not before.strip() and not between.strip() and not after.strip()
    return (
        before == ""
        and between == "\n"
        and after in ("", "\n")
        and len(think) > 2 and think.startswith("\n") and think.endswith("\n") and think.strip() != ""
        and len(answer) > 2 and answer.startswith("\n") and answer.endswith("\n") and answer.strip() != ""
    )


@REWARDS.register("format")
def format_reward(prompts: list[str], completions: list[str], *, think_in_prompt: bool = False, **fields) -> list[float]:
    """1.0 for a well-formed think/answer completion (loose whitespace), else 0.0."""
    return [float(format_ok(c, think_in_prompt=think_in_prompt)) for c in completions]


@REWARDS.register("format_strict")
def format_strict_reward(
    prompts: list[str], completions: list[str], *, think_in_prompt: bool = False, **fields
) -> list[float]:
    """1.0 only for the exact newline layout with non-empty blocks, else 0.0."""
    return [float(format_ok(c, strict=True, think_in_prompt=think_in_prompt)) for c in completions]


@REWARDS.register("tag_count")
def tag_count_reward(prompts: list[str], completions: list[str], *, think_in_prompt: bool = False, **fields) -> list[float]:
    """Partial credit, 0.25 per tag that occurs exactly once (a shaping signal early in training).

    >>> tag_count_reward([""], ["<think>x</think><answer>1</answer><answer>"])
    [0.75]
    """
    texts = [("<think>" + c) if think_in_prompt else c for c in completions]
    return [0.25 * sum(n == 1 for n in tag_counts(t).values()) for t in texts]


@REWARDS.register("gsm8k_format")
def gsm8k_format_reward(prompts: list[str], completions: list[str], **fields) -> list[float]:
    """1.0 when the completion gives its final answer as a GSM8K answer line, ``#### <number>``, whatever
    the number: the format alone, to be learned before (and scored apart from) correctness.

    >>> gsm8k_format_reward([""] * 3, ["5 + 3 = 8\\n#### 8", "The answer is 8.", "#### eight"])
    [1.0, 0.0, 0.0]
    """
    from grpoplus.rewards.extract import gsm8k_answer, last_number

    answers = [gsm8k_answer(c) for c in completions]
    return [float(a is not None and last_number(a) == a.replace(",", "")) for a in answers]
