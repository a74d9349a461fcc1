import pytest

from grpoplus.tasks import get_task
from grpoplus.tasks.arithmetic import arithmetic_reward, arithmetic_target
from grpoplus.tasks.base import Example


def evaluate_left_to_right(prompt: str) -> int:
    # independent check: Python evaluates + and - left to right, like the task
    return eval(prompt.rstrip("="), {"__builtins__": {}})


def test_splits_are_deterministic_disjoint_and_correct():
    task = get_task("arithmetic", seed=0, n_train=300, n_test=50)
    again = get_task("arithmetic", seed=0, n_train=300, n_test=50)
    other = get_task("arithmetic", seed=1, n_train=300, n_test=50)
    assert task.split("train") == again.split("train") and task.split("test") == again.split("test")
    assert task.split("test") != other.split("test")
    train, test = {e.prompt for e in task.split("train")}, {e.prompt for e in task.split("test")}
    assert len(train) == 300 and len(test) == 50 and not train & test
    for e in task.split("train"):
        assert int(e.answer) == evaluate_left_to_right(e.prompt) >= 0


def test_held_out_split_does_not_depend_on_n_train():
    assert get_task("arithmetic", n_train=10, n_test=20).split("test") == get_task(
        "arithmetic", n_train=200, n_test=20
    ).split("test")


def test_reference_response_is_rewarded_and_steps_are_right():
    task = get_task("arithmetic", n_train=100, n_test=10)
    examples = task.split("train")
    targets = [task.sft_target(e) for e in examples]
    assert task.reward([e.prompt for e in examples], targets, [e.answer for e in examples]) == [1.0] * 100
    assert arithmetic_target(Example("9-6+1+8-2=", "10")) == "3+1+8-2=4+8-2=12-2=10#10"
    assert len({len(t) for t in targets}) > 3  # responses vary in length


def test_verifier_right_wrong_and_garbage():
    completions = ["3+1=4#4", "3+1=5#5", "4", "#4 ", "##4", "#+4", "#04", "", "#4#5", None, 7]
    answers = ["4"] * len(completions)
    expected = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert arithmetic_reward(["3+1="] * len(completions), completions, answers) == expected


def test_difficulty_changes_problem_size():
    def max_ops(difficulty):
        task = get_task("arithmetic", difficulty=difficulty, n_train=200, n_test=0)
        return max(sum(ch in "+-" for ch in e.prompt) for e in task.split("train"))

    assert max_ops(3) == 3 and max_ops(7) == 7


def test_bad_arguments():
    with pytest.raises(ValueError, match="difficulty"):
        get_task("arithmetic", difficulty=0)
    with pytest.raises(ValueError, match="distinct problems"):
        get_task("arithmetic", difficulty=1, n_train=5000)
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        get_task("arithmetic", n_train=1, n_test=1).split("valid")
