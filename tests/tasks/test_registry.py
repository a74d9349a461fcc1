import pytest

from grpoplus.tasks import TASKS, get_task


def test_built_in_tasks_are_registered():
    assert {"arithmetic", "countdown"} <= set(TASKS.names())


def test_unknown_task_lists_the_tasks():
    with pytest.raises(ValueError, match="arithmetic.*countdown"):
        get_task("chess")


def test_unknown_argument_is_named():
    with pytest.raises(ValueError, match="levels"):
        get_task("arithmetic", levels=3)
