"""reasoning-gym data sets as the reasoning_gym task: scored by reasoning-gym's own score_answer on the completion's
final answer, with deterministic disjoint splits and the curriculum as the difficulty."""

import pytest

pytest.importorskip("reasoning_gym", reason="the reasoning_gym task needs reasoning-gym: pip install 'grpoplus[envs]'")

from grpoplus.tasks import TASKS, get_task  # noqa: E402
from grpoplus.tasks.base import reward_fields  # noqa: E402
from grpoplus.tasks.reasoning_gym import final_answer  # noqa: E402


def _scores(task, examples, completions):
    return task.reward([ex.prompt for ex in examples], completions, **reward_fields(examples))


@pytest.mark.parametrize("dataset", ["chain_sum", "basic_arithmetic"])
def test_the_reference_answer_scores_1_and_a_wrong_one_0(dataset):
    task = get_task("reasoning_gym", dataset=dataset, seed=0, size=30, test_size=10)
    examples = list(task.split("train")[:10]) + list(task.split("test"))
    assert _scores(task, examples, [ex.answer for ex in examples]) == [1.0] * 20
    assert _scores(task, examples, [f"so <answer>{ex.answer}</answer>" for ex in examples]) == [1.0] * 20
    assert _scores(task, examples, [f"{ex.answer} + 1 is not it. Answer: {int(ex.answer) + 1}" for ex in examples]) == [0.0] * 20
    assert all(ex.prompt.strip() and "rg_metadata" in ex.fields for ex in examples)


def test_the_metadata_rebuilds_the_entry_a_data_set_scores_from():
    task = get_task("reasoning_gym", dataset="countdown", seed=0, size=5, test_size=5)
    examples = task.split("test")
    # another expression of the same value (countdown checks the numbers and the target, kept in rg_metadata)
    assert _scores(task, examples, [f"<answer>({ex.answer})</answer>" for ex in examples]) == [1.0] * 5
    assert all(score < 1.0 for score in _scores(task, examples, ["1 + 1"] * 5))


def test_splits_are_deterministic_disjoint_and_follow_the_seed():
    a = get_task("reasoning_gym", dataset="chain_sum", seed=0, size=200, test_size=50)
    b = get_task("reasoning_gym", dataset="chain_sum", seed=0, size=200, test_size=50)
    c = get_task("reasoning_gym", dataset="chain_sum", seed=5000, size=200, test_size=50)
    assert a.split("train") == b.split("train") and a.split("test") == b.split("test")
    assert not {ex.prompt for ex in a.split("train")} & {ex.prompt for ex in a.split("test")}
    assert 190 <= len(a.split("train")) <= 200 and len(a.split("test")) == 50
    assert [ex.prompt for ex in a.split("train")] != [ex.prompt for ex in c.split("train")]
    small = get_task("reasoning_gym", dataset="chain_sum", seed=0, size=300, test_size=300, difficulty=0)  # tiny space
    assert not {ex.prompt for ex in small.split("train")} & {ex.prompt for ex in small.split("test")}


def test_difficulty_is_the_curriculum_level():
    easy = get_task("reasoning_gym", dataset="chain_sum", difficulty=0, size=20, test_size=1).split("train")
    hard = get_task("reasoning_gym", dataset="chain_sum", difficulty=4, size=20, test_size=1).split("train")
    assert all(ex.fields["rg_metadata"]["num_terms"] == 2 and ex.fields["rg_metadata"]["num_digits"] == 1 for ex in easy)
    assert max(ex.fields["rg_metadata"]["num_terms"] for ex in hard) > 2
    with pytest.raises(ValueError, match="has no curriculum"):
        get_task("reasoning_gym", dataset="gsm_symbolic", difficulty=1, size=1, test_size=1)


def test_the_final_answer_rule_and_the_errors():
    assert final_answer("think <answer> 12 </answer> then <answer>13</answer>") == "13"
    assert final_answer("so the <answer> 42") == "42" and final_answer("Final Answer: 7") == "7"
    assert final_answer("  9 \n") == "9"
    assert "reasoning_gym" in TASKS
    with pytest.raises(ValueError, match="needs the reasoning-gym data set"):
        get_task("reasoning_gym")
    with pytest.raises(ValueError, match="unknown data set 'no_such'"):
        get_task("reasoning_gym", dataset="no_such")


def test_a_reasoning_gym_data_set_trains_from_the_command_line(nano_dir, tmp_path):
    from grpoplus.entry.cli import main
    from grpoplus.metrics import read_metrics

    out = tmp_path / "rg"
    assert main(["train", "--model", nano_dir, "--out", str(out), "task=reasoning_gym",
                 "task_kwargs={dataset: chain_sum, size: 64}", "chat_template=false", "max_steps=1",
                 "prompts_per_step=2", "group_size=2", "max_new_tokens=4", "eval_size=4", "eval_samples=0",
                 "progress=false", "loggers=[]", "save_every=0"]) == 0
    assert read_metrics(out)[-1]["step"] == 1
