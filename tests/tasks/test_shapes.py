"""The ``shapes`` task (a vision-language policy's): its pictures hold the shapes its answers count, its worked
response marks each cell, and the built-in tiny vision-language model is warm-started on it with ``grpoplus sft``
and trained on it with ``grpoplus train``."""

import json

import numpy as np
import pytest

from grpoplus.config import ConfigError, build_config
from grpoplus.entry.cli import main
from grpoplus.metrics import read_metrics
from grpoplus.tasks import get_task
from grpoplus.tasks.shapes import CELL, shapes_reward, shapes_target

FAST = ["progress=false", "loggers=[]", "doctor_every=0", "eval_size=8", "eval_samples=0"]


def test_the_answer_counts_the_cells_whose_picture_holds_a_shape():
    task = get_task("shapes", difficulty=2, n_train=60, n_test=20)
    assert not {e.prompt for e in task.train} & {e.prompt for e in task.test}
    for example in task.test:
        marks = example.fields["cells"]
        assert example.answer == str(marks.count("x")) and shapes_target(example) == f"{marks}#{example.answer}"
        pixels = np.asarray(example.images[0].convert("L"), dtype=float)
        darkest = [pixels[(k // 2) * CELL:(k // 2 + 1) * CELL, (k % 2) * CELL:(k % 2 + 1) * CELL].min() for k in range(4)]
        assert all((d < 100) == (m == "x") for d, m in zip(darkest, marks))  # a shape is dark, an empty cell is not
    assert shapes_reward(["p"] * 3, ["x..x#2", "#2", "#3"], ["2"] * 3) == [1.0, 1.0, 0.0]


def test_a_text_model_is_refused_for_a_task_that_shows_images():
    with pytest.raises(ConfigError, match=r"^data.task=shapes: task 'shapes' shows images, and the built-in tiny model "
                                          r"is a text model: use a vision-language policy \(--model tiny-vlm"):
        build_config("grpo", overrides=["task=shapes"])
    build_config("grpo", overrides=["task=shapes", "learner.model=tiny-vlm"])


def test_the_tiny_vision_language_model_warm_starts_and_trains_on_the_task(tmp_path):
    warm = tmp_path / "sft"
    assert main(["sft", "--task", "shapes", "--model", "tiny-vlm", "--out", str(warm), "learner.train_vision=true",
                 "max_steps=6", "demos_per_step=8", "lr=3e-3", "warmup_steps=1", "eval_every=6", "save_every=6",
                 *FAST]) == 0
    assert read_metrics(warm)[-1]["loss/nll"] < read_metrics(warm)[1]["loss/nll"]
    run = tmp_path / "rl"
    assert main(["train", "--task", "shapes", "--model", str(warm / "checkpoints" / "step-6"), "--out", str(run),
                 "max_steps=2", "prompts_per_step=4", "group_size=4", "eval_every=2", *FAST]) == 0
    last = read_metrics(run)[-1]
    assert last["step"] == 2 and "eval/accuracy" in last and last["reward/errors"] == 0.0
    sample = json.loads((run / "samples.jsonl").read_text().splitlines()[0])
    assert 0 <= sample["prompt_index"] < 2000  # a training picture


def test_rollouts_with_images_run_ahead_of_the_learner(tmp_path):
    # rollout.max_staleness=1: the sampler's thread samples the next batch, its pictures passed through the wrapper
    run = tmp_path / "async"
    assert main(["train", "--task", "shapes", "--model", "tiny-vlm", "--out", str(run), "max_steps=3",
                 "prompts_per_step=2", "group_size=2", "max_new_tokens=6", "eval_every=0", "max_staleness=1",
                 *FAST]) == 0
    steps = [r for r in read_metrics(run) if r["step"] > 0]
    assert len(steps) == 3 and max(r["async/staleness_max"] for r in steps) == 1
