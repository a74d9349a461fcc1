"""The task contract: the registry of tasks, the fields a reward receives and the verdict of a score."""

import pytest

from grpoplus.tasks import TASKS, get_task
from grpoplus.tasks.base import Example, is_correct, reward_fields


def test_built_in_tasks_are_registered():
    assert {"arithmetic", "countdown"} <= set(TASKS.names())


def test_unknown_task_lists_the_tasks():
    with pytest.raises(ValueError, match="arithmetic.*countdown"):
        get_task("chess")


def test_unknown_argument_is_named():
    with pytest.raises(ValueError, match="levels"):
        get_task("arithmetic", levels=3)


def test_reward_fields_and_verdict():
    examples = [Example("1+1=", "2", {"numbers": [1]}), Example("2+2=", "4", {"numbers": [2]})]
    assert reward_fields(examples) == {"answer": ["2", "4"], "numbers": [[1], [2]]}
    assert [is_correct(s) for s in (1.0, 0.99, None, 0.0)] == [True, False, False, False]
