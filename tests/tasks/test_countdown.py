from fractions import Fraction

import pytest

from grpoplus.tasks import get_task
from grpoplus.tasks.countdown import countdown_reward, evaluate_expression


def test_reference_responses_reach_the_target_with_the_given_numbers():
    task = get_task("countdown", n_train=200, n_test=20)
    examples = task.split("train")
    completions = [task.sft_target(e) for e in examples]
    numbers = [e.fields["numbers"] for e in examples]
    scores = task.reward([e.prompt for e in examples], completions, [e.answer for e in examples], numbers=numbers)
    assert scores == [1.0] * len(examples)
    for e in examples:
        assert e.prompt == ",".join(map(str, e.fields["numbers"])) + f"->{e.answer}:"


def test_splits_are_deterministic_and_disjoint():
    a, b = get_task("countdown", n_train=100, n_test=30), get_task("countdown", n_train=100, n_test=30)
    assert a.split("train") == b.split("train")
    assert not {e.prompt for e in a.split("train")} & {e.prompt for e in a.split("test")}


def test_difficulty_is_the_count_of_numbers():
    for difficulty in (2, 5):
        task = get_task("countdown", difficulty=difficulty, n_train=20, n_test=0)
        assert {len(e.fields["numbers"]) for e in task.split("train")} == {difficulty}


def test_exact_rational_arithmetic():
    assert evaluate_expression("(25-3)*7/2", [3, 7, 25, 2]) == Fraction(77)
    assert evaluate_expression("7/2*2", [7, 2, 2]) == Fraction(7)  # 3.5 * 2, no integer truncation
    assert evaluate_expression("1/3+1/3", [1, 3, 1, 3]) == Fraction(2, 3)


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",        # a call: rejected by the character filter before parsing
        "2**999999999",            # a power: ** is not an allowed operation
        "9" * 101,                 # too long
        "3 // 2",                  # floor division is not + - * /
        "-3+7",                    # unary minus
        "3/(7-7)",                 # division by zero
        "3+3",                     # 3 given once, used twice
        "4+7",                     # 4 not given
        "(3+7",                    # syntax error
        "",
    ],
)
def test_invalid_expressions_score_none(expression):
    assert evaluate_expression(expression, [3, 7, 7]) is None


def test_reward_right_wrong_garbage():
    completions = ["#(2+3)*4", "2+3=5#2*3*4", "#4*5", "no hash", "#2**30", "#__import__('os').system('x')", None]
    n = len(completions)
    scores = countdown_reward(["2,3,4->20:"] * n, completions, ["20"] * n, numbers=[[2, 3, 4]] * n)
    assert scores == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_reward_needs_the_numbers_field():
    with pytest.raises(ValueError, match="numbers"):
        countdown_reward(["2,3->5:"], ["#2+3"], ["5"])
