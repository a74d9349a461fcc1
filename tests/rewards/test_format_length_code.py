"""Format, length and code rewards."""

import pytest

from grpoplus.rewards import REWARDS, code_reward, soft_overlong_penalty
from grpoplus.rewards.format import format_ok


@pytest.mark.parametrize(
    "text, loose, strict",
    [
        ("<think>\nwork\n</think>\n<answer>\n4\n</answer>", True, True),
        ("<think>work</think> <answer>4</answer>", True, False),
        ("<think>a</think><answer>1</answer><answer>2</answer>", False, False),  # repeated block
        ("<think>a<think>b</think></think><answer>1</answer>", False, False),  # nested block
        ("<answer>1</answer><think>a</think>", False, False),  # wrong order
        ("preamble <think>a</think><answer>1</answer>", False, False),  # text outside the blocks
        ("<think>\n\n</think>\n<answer>\n4\n</answer>", True, False),  # empty think block
    ],
)
def test_format(text, loose, strict):
    assert format_ok(text) is loose
    assert format_ok(text, strict=True) is strict


def test_format_with_think_opened_by_the_template():
    assert format_ok("work</think><answer>4</answer>", think_in_prompt=True)
    assert not format_ok("<think>work</think><answer>4</answer>", think_in_prompt=True)


def test_tag_count_partial_credit():
    fn = REWARDS.get("tag_count")
    assert fn(["q"] * 2, ["<think>x</think>", "<think>x</think><answer>1</answer>"]) == [0.5, 1.0]


def test_soft_overlong_matches_dapo_formula():
    # max_len 100, cache 20: free up to 80, linear to -1 at 100, -1 beyond
    fn = REWARDS.get("soft_overlong")
    assert fn(["q"] * 5, ["c"] * 5, max_len=100, cache=20, completion_length=[10, 80, 85, 100, 150]) == [
        0.0, 0.0, -0.25, -1.0, -1.0,
    ]
    with pytest.raises(ValueError, match="cache"):
        soft_overlong_penalty(10, max_len=100, cache=0)


def test_length_rewards_need_token_lengths():
    with pytest.raises(TypeError, match="completion_length"):
        REWARDS.get("length_penalty")(["q"], ["c"], max_len=10)


def test_kimi_length_reward_is_group_relative():
    fn = REWARDS.get("kimi_length")
    prompts = ["a", "a", "b", "b"]
    # group a: lengths 10/30 -> lam 0.5/-0.5; group b has equal lengths -> 0
    out = fn(prompts, ["x"] * 4, correct=[False, True, True, True], completion_length=[10, 30, 5, 5])
    assert out == [0.0, -0.5, 0.0, 0.0]


ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def test_code_reward_stdio_pairs_and_dict_layout():
    cases = [{"input": "1 2", "output": "3"}, {"input": "5 5", "output": "10\n"}, {"input": "1 1", "output": "3"}]
    assert code_reward(ADD, cases, timeout_s=5) == pytest.approx(2 / 3)
    assert code_reward(ADD, {"inputs": ["2 2"], "outputs": ["4"]}, timeout_s=5) == 1.0


def test_code_reward_assert_tests_and_a_hanging_case():
    program = "def f(x):\n    while x == 0:\n        pass\n    return 2 * x\n"
    tests = ["assert f(1) == 2", "assert f(2) == 5", "assert f(0) == 0"]  # pass, fail, hang
    assert code_reward(program, tests, timeout_s=1) == pytest.approx(1 / 3)


def test_code_reward_rejects_malformed_tests():
    with pytest.raises(ValueError, match="test case"):
        code_reward(ADD, [42])


def test_registered_code_reward_skips_samples_without_tests():
    fn = REWARDS.get("code")
    assert fn(["q", "q"], [ADD, ADD], tests=[[{"input": "1 1", "output": "2"}], None], timeout_s=5) == [1.0, None]
