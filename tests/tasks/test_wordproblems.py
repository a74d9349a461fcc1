"""The word-problem task: every answer is the worked solution's result, splits are disjoint and
deterministic, prompts ask for the GSM8K answer line, and chat prompts go through the template."""

import re

import pytest

from grpoplus.models.tokenizer import char_tokenizer
from grpoplus.rewards.format import gsm8k_format_reward
from grpoplus.tasks import get_task
from grpoplus.tasks.synthetic import with_chat_template
from grpoplus.tasks.wordproblems import INSTRUCTION, MAX_VALUE

LINE = re.compile(r"^(\d+) ([-+*/]) (\d+) = (\d+)$")


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_answers_are_the_worked_solutions_result(difficulty):
    task = get_task("wordproblems", difficulty=difficulty, n_train=300, n_test=50)
    for example in list(task.split("train")) + list(task.split("test")):
        lines = example.fields["solution"].splitlines()
        results = []
        for line in lines:
            a, op, b, c = LINE.match(line).groups()
            a, b, c = int(a), int(b), int(c)
            # Each worked line is exact integer arithmetic (division only where it is exact).
            assert {"+": a + b, "-": a - b, "*": a * b, "/": a // b if a % b == 0 else None}[op] == c, line
            results.append(c)
        assert str(results[-1]) == example.answer and 1 <= int(example.answer) <= MAX_VALUE
        # One line per step, plus one for a purchase of several items at a price (k * price, then the change).
        assert difficulty <= len(lines) <= 2 * difficulty
        assert example.prompt.endswith("\n" + INSTRUCTION)
        target = task.sft_target(example)
        assert task.reward([example.prompt], [target], [example.answer]) == [1.0]
        assert gsm8k_format_reward([example.prompt], [target]) == [1.0]


def test_splits_are_disjoint_and_deterministic():
    a, b = get_task("wordproblems", seed=3), get_task("wordproblems", seed=3)
    assert a.split("train") == b.split("train") and a.split("test") == b.split("test")
    assert not {e.prompt for e in a.split("train")} & {e.prompt for e in a.split("test")}
    assert a.split("test") != get_task("wordproblems", seed=4).split("test")


def test_bad_difficulty_is_named():
    with pytest.raises(ValueError, match="wordproblems difficulty must be an integer in \\[1, 4\\]"):
        get_task("wordproblems", difficulty=5)


def test_chat_prompts_go_through_the_template():
    tok = char_tokenizer()
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    task = get_task("wordproblems", n_train=20, n_test=5)
    assert task.chat
    chat = with_chat_template(task, tok, "model")
    raw, templated = task.split("train")[0], chat.split("train")[0]
    assert templated.prompt == f"<user>{raw.prompt}<assistant>" and templated.answer == raw.answer
    assert not chat.chat and len(chat.split("test")) == 5


def test_docstring_examples():
    import doctest

    import grpoplus.tasks.wordproblems as module

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
