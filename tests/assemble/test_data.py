"""The data factory runs from the plan's data part (grpoplus.plan.data.DataPlan): the same examples as the task
made by hand with the run's seeds, and a part that pickles and renders as plain YAML."""

import ast
import dataclasses
import pickle

import pytest
import yaml

from grpoplus.assemble.data import build_data, builtin_tasks, data_rows
from grpoplus.config import build_config
from grpoplus.plan import plan_files, resolve
from grpoplus.plan.data import DataPlan
from grpoplus.tasks import get_task

COUNTDOWN = ["task=countdown", "difficulty=4", "task_kwargs={n_train: 300, n_test: 40}", "seed=3", "eval_seed=1"]


def _plan(*overrides):
    return resolve(build_config("dapo", overrides=list(overrides)))


def test_a_builtin_tasks_examples_are_those_of_its_seeds():
    plan = _plan(*COUNTDOWN)
    task, train, test = build_data(plan.data, None, plan.seed)
    own = get_task("countdown", seed=3, difficulty=4, n_train=300, n_test=40)  # run.seed: the training problems
    held_out = list(get_task("countdown", seed=1, difficulty=4, n_train=300, n_test=40).split("test"))  # eval_seed
    assert task == own and test == held_out
    kept = [ex for ex in own.split("train") if ex.prompt not in {h.prompt for h in held_out}]
    assert train == kept and len(kept) > 250


def test_one_seed_makes_the_task_once_and_reads_no_rows():
    plan = _plan("seed=2", "eval_seed=2")
    task, held_out = builtin_tasks(plan.data, plan.seed)
    assert task is held_out and data_rows(plan.data) is None
    assert builtin_tasks(_plan("data=rows.jsonl", "model=tiny-untrained").data, 0) is None


def test_the_data_plan_is_frozen_pickles_and_renders_as_plain_yaml():
    plan = _plan(*COUNTDOWN, "max_new_tokens=20", "long_prompts=drop")
    data = plan.data
    with pytest.raises(dataclasses.FrozenInstanceError):
        data.eval_seed = 5
    assert pickle.loads(pickle.dumps(data)) == data
    assert (data.task, data.difficulty, dict(data.task_kwargs), data.eval_seed) == ("countdown", 4,
                                                                                  {"n_train": 300, "n_test": 40}, 1)
    assert (data.max_new_tokens, data.long_prompts, data.env, data.model) == (20, "drop", None, None)
    text = plan_files(plan)["data.yaml"]
    assert yaml.safe_load(text) == plan.to_dict()["data"]
    assert yaml.safe_load(text)["task_kwargs"] == [["n_train", 300], ["n_test", 40]]
    assert "!!" not in text  # no Python object tags: plain YAML


def test_a_multi_turn_runs_data_plan_names_its_environment():
    assert _plan("tools=[calculator]").data.env == "tools" and _plan("task=guess").data.env == "guess"


def test_the_data_plan_module_imports_no_torch_and_reads_no_file():
    from grpoplus.plan import data as module

    tree = ast.parse(open(module.__file__).read())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    calls = {getattr(n.func, "id", getattr(n.func, "attr", None)) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert imported == {"__future__", "dataclasses", "grpoplus.config"}
    assert not calls & {"open", "read_text", "read_rows", "load_records", "get_task"}
    assert [f.name for f in dataclasses.fields(DataPlan) if f.name.endswith("seed")] == ["eval_seed"]
