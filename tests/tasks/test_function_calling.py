"""The built-in function_calling task: deterministic disjoint splits whose reference responses the reward scores
1.0, prompts the character model can read, the rows written as a data set that loads back, and `grpoplus train`
on it end to end (the task, and its rows as a data file)."""

import json

import pytest

from grpoplus.data import load_records
from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics
from grpoplus.models.tokenizer import ALPHABET
from grpoplus.tasks import get_task
from grpoplus.tasks.function_calling_rows import main as write_rows

SMALL = ["prompts_per_step=2", "group_size=2", "max_new_tokens=8", "eval_size=2", "eval_samples=0", "progress=false",
         "loggers=[]", "doctor_every=0", "save_every=0", "micro_batch_size=4"]


def _score(task, example, completion: str) -> float:
    return task.reward([example.prompt], [completion], [example.answer], **{k: [v] for k, v in example.fields.items()})[0]


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_the_reference_responses_score_one_and_the_splits_are_disjoint(difficulty):
    task = get_task("function_calling", difficulty=difficulty, n_train=300, n_test=50)
    train, test = task.split("train"), task.split("test")
    assert not {e.prompt for e in train} & {e.prompt for e in test}
    assert [e.prompt for e in test] == [e.prompt for e in get_task("function_calling", difficulty=difficulty,
                                                                   n_train=10, n_test=50).split("test")]
    assert all(_score(task, e, task.sft_target(e)) == 1.0 for e in train[:100])
    assert all(set(e.prompt + task.sft_target(e)) <= set(ALPHABET) for e in train)  # the character model reads it
    assert all(len(e.prompt) + len(task.sft_target(e)) <= 254 for e in train)  # within the tiny model's 256
    assert all(e.prompt.count("(") == difficulty for e in train)  # the tools offered
    assert any(e.fields["parallel"] for e in train) == (difficulty >= 3)


def test_a_prompt_lists_its_tools_and_a_wrong_call_scores_zero():
    task = get_task("function_calling", n_train=20, n_test=5)
    example = next(e for e in task.split("train") if "convert" in task.sft_target(e))
    assert example.prompt.startswith("tools: ") and example.prompt.endswith("\n")
    wrong = task.sft_target(example).replace('"value":', '"amount":')
    assert _score(task, example, wrong) == 0.0 and _score(task, example, "no call") == 0.0


def test_the_response_length_fits_the_task_unless_given():
    from grpoplus.config import build_config

    fitted = build_config(overrides=["task=function_calling"])
    assert fitted.rollout.max_new_tokens == fitted.algo.max_len == 128
    assert build_config(overrides=["task=function_calling", "max_new_tokens=40"]).rollout.max_new_tokens == 40
    assert build_config(overrides=["task=arithmetic"]).rollout.max_new_tokens == 48


def test_the_rows_written_as_a_data_set_load_back(tmp_path):
    path = tmp_path / "rows.jsonl"
    write_rows([str(path), "--rows", "20", "--difficulty", "3"])
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 20 and {"tools", "messages", "answer", "parallel", "tool_results"} <= set(rows[0])
    data = load_records(path, on_bad_row="error")
    assert data.function_calls and len(data.records) == 20
    assert data.records[0]["fields"]["tools"][0]["function"]["description"]  # the full schemas, for a chat model


@pytest.mark.slow
def test_train_runs_on_the_task_and_on_its_rows_as_a_data_file(nano_dir, tmp_path):
    out = tmp_path / "task"
    assert main(["train", "--task", "function_calling", "--model", nano_dir, "--out", str(out), "max_steps=2",
                 *SMALL]) == 0
    records = read_metrics(out)
    assert [r["step"] for r in records] == [0, 1, 2] and "reward/task/mean" in records[-1]
    rows = tmp_path / "rows.jsonl"
    write_rows([str(rows), "--rows", "24", "--difficulty", "1"])  # one tool: a prompt of about 500 characters
    out = tmp_path / "data"
    args = ["train", "--data", str(rows), "--model", nano_dir, "--out", str(out), "max_steps=1",
            "rewards=[function_call]", *SMALL]
    assert main(args) == 2  # its prompts, tools described, are past the nano model's 256 positions
    assert main([*args, "long_prompts=truncate_left"]) == 0  # their last tokens: the question
    last = read_metrics(out)[-1]
    assert "reward/function_call/mean" in last and last["reward/errors"] == 0.0
