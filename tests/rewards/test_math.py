"""Math reward: extraction, equivalence, and the hard time limit of the verifier."""

import math
import threading

import pytest

from grpoplus.rewards import REWARDS, extract_answer, last_boxed, math_reward
from grpoplus.rewards.events import Unscored, delta, snapshot
from grpoplus.rewards.pipeline import RewardPipeline, parse_reward_specs

POWER_TOWER = r"\boxed{2^{2^{2^{2^{2^{2}}}}}}"  # sympy tries to evaluate this for ever


@pytest.mark.parametrize(
    "completion, answer",
    [
        (r"so \boxed{\frac{1}{2}}", "0.5"),  # fraction vs decimal
        ("#### 1,024", "1024"),  # GSM8K marker, thousands separator
        (r"the rate is \boxed{50\%}", "0.5"),  # percentage
        (r"<answer>(x+1)^2</answer>", "x^2+2x+1"),  # algebraic equality
        (r"\boxed{\sqrt{4}}", "2"),
        ("<answer>12,345</answer>", "12345"),
    ],
)
def test_equivalent_answers_score_one(completion, answer):
    assert math_reward(completion, answer) == 1.0


@pytest.mark.parametrize(
    "completion, answer",
    [(r"\boxed{41}", "42"), ("no final answer 42", "42"), (r"\boxed{x+1}", "x+2"), (r"\boxed{3", "3")],
)
def test_wrong_or_missing_answers_score_zero(completion, answer):
    assert math_reward(completion, answer) == 0.0


def test_nested_braces_and_last_box_win():
    assert last_boxed(r"\boxed{1} and finally \boxed{\frac{a^{2}}{b}}") == r"\frac{a^{2}}{b}"
    assert extract_answer(r"<answer>\boxed{7}</answer>") == "7"


def test_last_number_fallback_only_when_configured():
    assert math_reward("I get 17 in the end", "17") == 0.0
    assert math_reward("I get 17 in the end", "17", fallback_last_number=True) == 1.0


def test_power_tower_hang_is_unscored_not_zero_is_counted_and_the_verifier_recovers():
    before = snapshot()
    score = math_reward(POWER_TOWER, "1", timeout_s=1.0)
    assert isinstance(score, Unscored) and score.kind == "timeout" and math.isnan(score)
    assert delta(before, snapshot()) == {"verifier/timeouts": 1}
    assert math_reward(r"\boxed{\frac{3}{4}}", "0.75") == 1.0  # the replacement worker answers


def test_a_hung_check_leaves_the_sample_out_of_its_group_as_a_timeout(hanging_verifier):
    pipeline = RewardPipeline(parse_reward_specs(["math:timeout_s=1.0"]), timeout_s=10)
    result = pipeline(["q"] * 3, [r"\boxed{HANG}", r"\boxed{1}", r"\boxed{2}"], {"answer": ["1", "1", "1"]})
    assert result.scored == [False, True, True]
    assert result.components["math"] == [None, 1.0, 0.0]
    assert result.metrics["reward/timeouts"] == 1 and result.metrics["reward/math/verifier_timeouts"] == 1
    assert "reward/math/nonfinite" not in result.metrics  # a timeout, not a NaN the reward computed


def test_time_limit_works_from_a_non_main_thread():
    # signal.alarm cannot fire outside the main thread; a killed process can
    results = []
    thread = threading.Thread(target=lambda: results.append(math_reward(POWER_TOWER, "1", timeout_s=1.0)))
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive() and len(results) == 1 and isinstance(results[0], Unscored)


def test_registered_math_reward_needs_answers():
    fn = REWARDS.get("math")
    assert fn(["q", "q"], [r"\boxed{2}", r"\boxed{3}"], answer=["2", "2"]) == [1.0, 0.0]
